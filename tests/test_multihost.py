"""Several processes agree: a signal that reaches one process of a multi-host run stops every
process at the same step, with one checkpoint of that step that restores; and processes that
see a workdir differently still resume from the same checkpoint.

Two processes of 2 CPU devices each, joined through jax.distributed on localhost (as
tests/test_sharding.py does, there in new Pythons): here children of the fork server
(tests/conftest.py's ForkedProcess), each a process of its own, signalled at its own pid.
"""

import json
import signal
import time
from pathlib import Path

import jax
import pytest
from conftest import fork_popen, fork_run, free_port, reaped, simulated_devices_env, train_quietly

from transformer import checkpoint
from transformer import config as config_lib
from transformer.parallel import sharding
from transformer.train import start

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra) -> dict:
    return simulated_devices_env(2, JAX_PLATFORMS="cpu", **extra)


@pytest.mark.slow  # ~19 s of CPU, two train.py processes (docs/testing.md)
def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path):
    workdir = tmp_path / "run"
    args = ["train.py", "--config=configs/tiny.py", "--no_progress",
            "--config.data.corpus=copy", "--config.train.steps=400",
            "--config.train.log_every=1", "--config.train.eval_every=1000",
            "--config.train.ckpt_every=1000", "--config.mesh.fsdp=2",
            f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{free_port()}",
            "--num_processes=2"]
    with reaped([fork_popen(args + [f"--process_id={i}"], cwd=ROOT,
                            env=_env(TRANSFORMER_TEST_STEP_DELAY="0.02"))
                 for i in range(2)]) as procs:
        deadline = time.monotonic() + 120
        while not (workdir / "metrics.jsonl").exists():  # written from the first steps on
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        time.sleep(0.5)  # well inside the loop
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60) for p in procs]
    statuses = [p.returncode for p in procs]
    assert statuses == [128 + signal.SIGTERM] * 2, [err[-2000:] for _, err in outputs]
    # Only process 0 prints: the other's stdout (where Gloo announces its connections) is
    # its waiting line alone.
    assert outputs[1][0].strip().startswith("process 1 of 2: waiting for the others")
    assert len(outputs[1][0].strip().splitlines()) == 1, outputs[1][0][-2000:]
    steps = [int(err.split("stopped by SIGTERM at step ")[1].split(";")[0]) for _, err in outputs]
    assert steps[0] == steps[1] and 0 < steps[0] < 400, steps

    one_device = config_lib.to_dict(config_lib.base_config())["mesh"]  # this process's device
    mesh = sharding.make_mesh(one_device)
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    found = ckpts.restore_good(lambda meta: start.abstract_checkpoint(
        config_lib.from_dict({**meta["config"], "mesh": one_device}), mesh))
    ckpts.close()
    assert ckpts.all_steps() == [steps[0]] and found.step == steps[0]
    assert int(found.train["step"]) == steps[0] and jax.tree.leaves(found.params)


def test_processes_resume_from_the_same_step_when_one_finds_the_newest_damaged(tmp_path):
    config = config_lib.base_config()
    config.model.update(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                        max_seq_len=16, matmul="plain")
    config.data.corpus = "copy"
    config.train.update(steps=4, batch_size=4, ckpt_every=2, eval_every=1000, eval_batches=1)
    config.sample.max_new_tokens = 4
    train_quietly(config, tmp_path)  # checkpoints 2 and 4

    port = free_port()
    with reaped([fork_popen(["tests/multihost_resume_check.py", tmp_path, port, i], cwd=ROOT,
                            env=_env()) for i in range(2)]) as procs:
        outputs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
    found = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert found[0] == found[1] == {"step": 2, "damaged": [4]}, found


def test_a_process_started_alone_says_it_waits_and_gives_up_in_one_line():
    args = ["train.py", "--config=configs/tiny.py", "--no_progress",
            f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2",
            "--process_id=1", "--join_timeout=3"]
    started = time.monotonic()
    out = fork_run(*args, cwd=ROOT, env=_env(), timeout=120)
    assert out.returncode == 2 and time.monotonic() - started < 60, out.stderr[-2000:]
    assert "waiting for the others at the coordinator" in out.stdout
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "not every process joined" in line


def test_progress_lines_are_printed_by_process_0_only(capsys):
    from transformer.train.metrics import Progress
    Progress(0, 10, enabled=False, lines=False).write("step 5: val_loss 1.0")
    Progress(0, 10, enabled=False).write("step 6: val_loss 1.0")
    err = capsys.readouterr().err
    assert "step 5" not in err and "step 6" in err

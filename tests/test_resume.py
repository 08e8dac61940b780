"""A run survives being killed: SIGKILL anywhere (also mid-save), SIGTERM, a damaged latest
checkpoint and a NaN all end in the same final params as a run never interrupted, bit for bit.

Every run here is a real `train.py` / `sample.py` process on a tiny char-level model: a child
forked from a process that has imported jax and the package (tests/fork_server.py), signalled
at its own pid, which starts as a new process would, less ~1.3 s of CPU.
Test hooks (transformer/train/faults.py) slow steps and saves down so that kills land mid-run and
mid-save, and poison one batch with NaN. The subprocesses share the session's persistent
compilation cache (tests/conftest.py) only to save time: it changes no numbers, since the
uninterrupted baseline and the killed runs then run the very same executables.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 36
MODEL = ["--config=configs/tiny.py", "--config.model.d_model=32", "--config.model.n_heads=2",
         "--config.model.n_layers=1", "--config.model.d_ff=64", "--config.model.max_seq_len=32",
         "--config.model.vocab_size=0", "--config.data.tokenizer=char",
         "--config.train.batch_size=4", "--config.train.warmup_steps=4",
         "--config.train.log_every=4", "--config.train.eval_every=12",
         "--config.train.eval_batches=1", "--config.train.keep_checkpoints=2",
         "--config.sample.max_new_tokens=0", "--config.sample.prompt=the ", "--no_progress"]
# sample.max_new_tokens=0: no sample at the end, nor its compile alongside training (~2-4 s
# of CPU a run); the runs here are read back with sample.py where a sample matters.


def write_corpus(path: Path) -> Path:
    words = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly boxes".split()
    rng = random.Random(0)
    path.write_text("".join(" ".join(rng.choices(words, k=9)) + ".\n" for _ in range(400)))
    return path


def train_args(corpus, workdir, steps=STEPS, ckpt_every=4, extra=()):
    return ["train.py", *MODEL, f"--config.data.corpus={corpus}", f"--workdir={workdir}",
            f"--config.train.steps={steps}", f"--config.train.ckpt_every={ckpt_every}", *extra]


def env_with(**hooks):
    # The compilation cache comes with os.environ (tests/conftest.py).
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.update({f"TRANSFORMER_TEST_{k.upper()}": str(v) for k, v in hooks.items()})
    return env


def run(args, **hooks) -> subprocess.CompletedProcess:
    """Runs and waits: a child of the fork server (tests/conftest.py's fork_run), not a new
    Python (~1.3 s of CPU less a run)."""
    from tests.conftest import fork_run
    return fork_run(*args, cwd=ROOT, env=env_with(**hooks), timeout=300)


def start(args, **hooks):
    """Started, not waited for: a child of the fork server too (conftest's ForkedProcess),
    signalled at its own pid like a subprocess.Popen."""
    from tests.conftest import fork_popen
    return fork_popen(args, cwd=ROOT, env=env_with(**hooks))


def committed(workdir) -> list[int]:
    folder = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() \
        else []


def in_flight(workdir) -> list[str]:
    folder = Path(workdir) / "checkpoints"
    return [p.name for p in folder.iterdir() if "tmp" in p.name] if folder.exists() else []


def wait_for(predicate, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def final_state(workdir):
    """(step, leaves of params and optimizer state as numpy) of the newest checkpoint."""
    import jax

    from transformer import checkpoint
    from transformer import config as config_lib
    from transformer.parallel import sharding
    from transformer.train import start

    def abstract(meta):
        config = config_lib.from_dict(meta["config"])
        return start.abstract_checkpoint(config, sharding.make_mesh(config.mesh))

    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    found = ckpts.restore_good(abstract)
    return found.step, [np.asarray(x) for x in jax.tree.leaves((found.params, found.train))]


def assert_bitwise_equal(workdir, reference):
    step, leaves = final_state(workdir)
    ref_step, ref_leaves = reference
    assert step == ref_step == STEPS
    assert len(leaves) == len(ref_leaves)
    for a, b in zip(leaves, ref_leaves):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "text.txt")


@pytest.fixture(scope="module")
def baseline(corpus, tmp_path_factory):
    """A run never interrupted: its workdir and final state."""
    workdir = tmp_path_factory.mktemp("baseline") / "run"
    out = run(train_args(corpus, workdir))
    assert out.returncode == 0, out.stderr
    return workdir, final_state(workdir)


@pytest.mark.slow  # in process: test_training's resumed == uninterrupted
def test_sigkill_at_random_moments_and_mid_save_resumes_bit_exact(corpus, baseline, tmp_path):
    rng = random.Random(int(os.environ.get("RESUME_TEST_SEED", "1234")))
    workdir = tmp_path / "run"
    args = train_args(corpus, workdir)
    kills = []

    def kill(proc, when):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append((when, proc.returncode, committed(workdir), in_flight(workdir)))

    def kill_mid_save(proc):
        # A new commit first: by then the writer has cleaned any tmp folder a previous kill
        # left, so a tmp folder seen afterwards belongs to a save of this process.
        before = committed(workdir)
        wait_for(lambda: committed(workdir) != before, proc)
        wait_for(lambda: in_flight(workdir), proc)
        kill(proc, "mid-save")
        assert in_flight(workdir), "the kill was meant to land inside a save"

    # 1. Mid-run, at a random moment after the first checkpoint exists.
    proc = start(args, step_delay=0.03)
    wait_for(lambda: committed(workdir), proc)
    time.sleep(rng.uniform(0.0, 0.2))
    kill(proc, "random, mid-run")

    # 2. During a save (saves held 1 s before orbax's final rename), while sample.py reads
    #    the same workdir: a concurrent reader only ever sees complete checkpoints.
    proc = start(args, step_delay=0.01, save_delay=1.0)
    reader = start(["sample.py", f"--workdir={workdir}", "--max_new_tokens=4", "--prompt=the "])
    kill_mid_save(proc)
    stdout, stderr = reader.communicate(timeout=120)
    assert reader.returncode == 0 and "--- sample 0 (step " in stdout, stderr

    # 3. During a save again, later in the run.
    kill_mid_save(start(args, step_delay=0.01, save_delay=0.5))

    # 4. At a random moment from process start: startup, restore, compile or training.
    proc = start(args, step_delay=0.1, save_delay=0.2)
    time.sleep(rng.uniform(0.5, 4.0))
    kill(proc, "random from start")

    out = run(args)
    print("kills (when, status, committed, in flight):", *kills, sep="\n  ")
    print("final run:", out.stdout.splitlines()[0])
    assert sum(status == -signal.SIGKILL for _, status, *_ in kills) >= 3
    assert out.returncode == 0, out.stderr
    # (the last killed run may have finished first on a fast machine: then it says so)
    assert "resuming from step" in out.stdout or "is finished" in out.stdout
    assert "--- sample" not in out.stdout  # sample.max_new_tokens=0 asks for none
    assert not in_flight(workdir), "leftover tmp folders are cleaned when a writer opens"
    assert_bitwise_equal(workdir, baseline[1])


@pytest.mark.slow  # the Muon run below (configs/default.py's optimizer) is the default run's
def test_sigterm_saves_the_current_step_and_resume_is_exact(corpus, baseline, tmp_path):
    workdir = tmp_path / "run"
    # ckpt_every is a free field: no periodic saves, so the one at SIGTERM is the only one.
    proc = start(train_args(corpus, workdir, ckpt_every=1000), step_delay=0.05)
    wait_for(lambda: (workdir / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    stopped_at = int(stderr.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert 4 <= stopped_at < STEPS
    assert committed(workdir) == [stopped_at]

    out = run(train_args(corpus, workdir))
    assert out.returncode == 0, out.stderr
    assert f"resuming from step {stopped_at}" in out.stdout
    assert_bitwise_equal(workdir, baseline[1])


def test_a_muon_run_stopped_by_sigterm_resumes_bit_exact(corpus, baseline, tmp_path):
    """train.optimizer=muon: the partitioned state (Muon's momentum for the matrices, AdamW's
    moments for the rest, their counts) saves and restores so that the resumed run ends in
    the uninterrupted run's params and state, bit for bit."""
    muon = ["--config.train.optimizer=muon", "--config.train.muon_lr=0.03"]
    out = run(train_args(corpus, tmp_path / "full", extra=muon))
    assert out.returncode == 0, out.stderr
    reference = final_state(tmp_path / "full")
    workdir = tmp_path / "run"
    proc = start(train_args(corpus, workdir, ckpt_every=1000, extra=muon), step_delay=0.05)
    wait_for(lambda: (workdir / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    stopped_at = int(stderr.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert 4 <= stopped_at < STEPS
    out = run(train_args(corpus, workdir, extra=muon))
    assert out.returncode == 0, out.stderr
    assert f"resuming from step {stopped_at}" in out.stdout
    assert_bitwise_equal(workdir, reference)
    assert len(reference[1]) != len(baseline[1][1])  # another state: Muon really ran


def test_damaged_latest_checkpoint_falls_back_with_a_warning(baseline, corpus, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(baseline[0], workdir)
    latest, previous = committed(workdir)[-1], committed(workdir)[-2]
    for f in (workdir / "checkpoints" / str(latest) / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 64:  # truncate the array data
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    reader = run(["sample.py", f"--workdir={workdir}", "--max_new_tokens=4", "--prompt=the "])
    assert reader.returncode == 0, reader.stderr
    assert f"checkpoint {latest}" in reader.stderr and "damaged" in reader.stderr
    assert f"(step {previous})" in reader.stdout

    out = run(train_args(corpus, workdir))
    assert out.returncode == 0, out.stderr
    assert "damaged" in out.stderr and f"resuming from step {previous}" in out.stdout
    assert (workdir / "checkpoints-damaged" / str(latest)).is_dir()
    assert_bitwise_equal(workdir, baseline[1])


def test_nan_stops_naming_the_step_or_is_skipped_and_counted(corpus, tmp_path):
    workdir = tmp_path / "run"
    args = train_args(corpus, workdir)  # the baseline's config: its programs are cached
    out = run(args, nan_step=6)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: step 6:") and "not finite" in lines[0]
    assert committed(workdir) == [4]  # the checkpoint before the fault is intact, none after

    out = run([*args, "--config.train.nonfinite=skip"], nan_step=6)
    assert out.returncode == 0, out.stderr
    assert "resuming from step 4" in out.stdout
    logged = [line for line in (workdir / "metrics.jsonl").read_text().splitlines()
              if '"skipped_steps"' in line]
    assert logged and '"skipped_steps": 1' in logged[-1]
    step, leaves = final_state(workdir)
    assert step == STEPS and all(np.isfinite(x).all() for x in leaves if x.dtype.kind == "f")


def test_second_ctrl_c_quits_at_once_leaving_only_complete_checkpoints(corpus, tmp_path):
    workdir = tmp_path / "run"
    proc = start(train_args(corpus, workdir, ckpt_every=1000), step_delay=0.05, save_delay=30)
    wait_for(lambda: (workdir / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGINT)  # starts the save at the current step, held 30 s
    wait_for(lambda: in_flight(workdir), proc)
    begin = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    assert proc.returncode == -signal.SIGINT and time.monotonic() - begin < 20
    assert committed(workdir) == [] and in_flight(workdir)  # the held save never committed


def test_a_second_run_on_a_workdir_in_use_is_refused_until_the_first_ends(corpus, tmp_path):
    workdir = tmp_path / "run"
    # Slow enough that the first run is still training (32 more steps, 16 s) whenever the
    # second has started up, however loaded the machine: at 0.05 s a step it could finish
    # first, and the second then trained normally (seen on a loaded 2-core machine).
    first = start(train_args(corpus, workdir), step_delay=0.5)
    wait_for(lambda: committed(workdir), first)  # it holds the workdir by its first save
    second = run(train_args(corpus, workdir))
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert "another training run is using it" in lines[0] and f"pid {first.pid}" in lines[0]
    assert first.poll() is None, "the refused run must not disturb the first"

    first.send_signal(signal.SIGKILL)  # the kernel drops its lock: nothing stale is left
    first.wait()
    third = run(train_args(corpus, workdir))
    assert third.returncode == 0, third.stderr
    assert "resuming from step" in third.stdout


def test_a_finished_run_started_again_says_so_and_how_to_continue(baseline, corpus, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(baseline[0], workdir)
    again = run(train_args(corpus, workdir))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "is finished" in again.stdout and "--allow_change=train.steps" in again.stdout
    assert "resuming from step" not in again.stdout


def test_train_without_config_on_a_run_names_the_config_it_was_trained_with(baseline, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(baseline[0], workdir)
    out = run(["train.py", f"--workdir={workdir}", "--no_progress"])
    assert out.returncode == 2, out.stdout[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert "train.py without --config uses configs/default.py" in line
    # The command that gives the saved config: the closest file plus the fields that differ.
    assert "--config=configs/tiny.py" in line and "--config.model.d_model=32" in line, line
    assert f"--config.train.steps={STEPS}" in line
    # The file is the one its checkpoint names; one saved before checkpoints named it says so.
    for meta in (workdir / "checkpoints").glob("*/meta/metadata"):
        meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items()
                                    if k != "config_file"}))
    out = run(["train.py", f"--workdir={workdir}", "--no_progress"])
    assert out.returncode == 2, out.stdout[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert "its checkpoint does not name" in line and "pass that file as --config" in line, line


def test_train_without_config_on_a_run_with_damaged_checkpoints_is_one_line(baseline, tmp_path):
    """The saved config is read from the newest checkpoint that still says it; when none
    does, the run's own error (no readable checkpoint) is the line, never a traceback."""
    workdir = tmp_path / "run"
    shutil.copytree(baseline[0], workdir)
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) > 1
    (workdir / "checkpoints" / str(steps[-1]) / "meta" / "metadata").write_text("{cut")
    out = run(["train.py", f"--workdir={workdir}", "--no_progress"])
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = [x for x in out.stderr.strip().splitlines() if not x.startswith("warning:")]
    assert "--config=configs/tiny.py" in line, line
    for step in steps:
        (workdir / "checkpoints" / str(step) / "meta" / "metadata").write_text("{cut")
    out = run(["train.py", f"--workdir={workdir}", "--no_progress"])
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = [x for x in out.stderr.strip().splitlines() if not x.startswith("warning:")]
    assert line.startswith("error:") and "no readable checkpoint" in line, line

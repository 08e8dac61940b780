"""Sharding: meshes, rules and the sharded train step, decode and checkpoint restore.

Checks that need several devices run in subprocesses (this pytest process keeps its one
device), children of the suite's fork server (tests/conftest.py's fork_run: each a process of
its own, its device count in its XLA_FLAGS): tests/sharding_check.py on 8 simulated CPU
devices, and train.py as two processes of 2 devices joined through jax.distributed against
one process of 4 devices.
"""

import json
import math
import re
import shutil
from pathlib import Path

import flax.linen as nn
import numpy as np
import pytest
from conftest import fork_popen, fork_run, free_port, reaped, simulated_devices_env
from jax.sharding import AbstractMesh, AxisType

from transformer.config import ConfigError, base_config, validate
from transformer.data import batches
from transformer.parallel import sharding

ROOT = Path(__file__).resolve().parent.parent


def _abstract_mesh(shape):
    return AbstractMesh(shape, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)


@pytest.mark.parametrize("sizes,n", [((2, 2, 2), 1), ((2, 2, 2), 4), ((-1, 2, 2), 1),
                                     ((3, -1, 1), 8), ((1, 3, 2), 4), ((-1, 3, 1), 4)])
def test_the_mesh_fix_the_error_names_works(sizes, n):
    """Following the refusal's words must give a mesh that fits: "set one axis to -1" with
    2 x 2 x 2 on one device was refused again (the fixed axes take 4 devices), and "does
    not divide the devices" said no fix at all."""
    mesh = base_config().mesh
    mesh.update(**dict(zip(sharding.MESH_AXES, sizes)))
    with pytest.raises(ConfigError) as refused:
        sharding.mesh_shape(mesh, n)
    fix = re.search(r"(?:set|e\.g\.) (mesh\.\w+=-?\d+(?:, mesh\.\w+=-?\d+)*)", str(refused.value))
    assert fix, str(refused.value)
    for assignment in fix.group(1).split(", "):
        axis, value = assignment.removeprefix("mesh.").split("=")
        mesh[axis] = int(value)
    assert math.prod(sharding.mesh_shape(mesh, n)) == n


def test_mesh_sizes_resolve_and_bad_ones_name_the_numbers():
    mesh = base_config().mesh
    assert sharding.mesh_shape(mesh, 8) == (8, 1, 1)  # the default: every device on data
    mesh.update(data=2, fsdp=-1, tensor=2)
    assert sharding.mesh_shape(mesh, 8) == (2, 2, 2)
    mesh.update(data=2, fsdp=2, tensor=2)
    with pytest.raises(ConfigError, match=r"2 x 2 x 2 = 8 devices, but there are 4"):
        sharding.mesh_shape(mesh, 4)
    mesh.update(data=3, fsdp=-1, tensor=1)
    with pytest.raises(ConfigError, match=r"mesh.data=3.*does not divide the 8 devices"):
        sharding.mesh_shape(mesh, 8)
    mesh.update(data=-1, fsdp=-1)
    with pytest.raises(ConfigError, match="at most one"):
        sharding.mesh_shape(mesh, 8)


@pytest.mark.parametrize("field, value, shape, message", [
    ("model.n_heads", 4, (1, 1, 8), r"model.n_heads=4 is not divisible by 8 \(mesh.tensor=8"),
    ("train.batch_size", 6, (2, 2, 1), r"train.batch_size=6 is not divisible by 4 "
                                       r"\(mesh.data=2 x mesh.fsdp=2"),
    ("model.d_model", 48, (1, 32, 1), r"model.d_model=48 is not divisible by 32"),
])
def test_sizes_the_mesh_cannot_split_fail_at_start_up(field, value, shape, message):
    config = base_config()
    config.model.update(d_model=64, n_heads=4, d_ff=256)
    config.train.batch_size = 64
    section, key = field.split(".")
    config[section][key] = value
    with pytest.raises(ConfigError, match=message):
        sharding.check_fits(config, _abstract_mesh(shape))


def test_swiglu_checks_the_hidden_width_it_splits_not_d_ff():
    """SwiGLU's MLP is 2/3 of d_ff wide: d_ff=256 divides by 16, its 168 columns do not."""
    config = base_config()
    config.model.update(d_model=64, n_heads=16, d_ff=256, vocab_size=256, mlp="swiglu",
                        matmul="plain")
    config.train.batch_size = 16
    with pytest.raises(ConfigError, match=r"model.d_ff=256 \(SwiGLU's hidden width .*168\) "
                                          r"is not divisible by 16 \(mesh.tensor=16"):
        sharding.check_fits(config, _abstract_mesh((1, 1, 16)))
    config.model.mlp = "gelu"  # the same d_ff splits evenly when it is the width
    sharding.check_fits(config, _abstract_mesh((1, 1, 16)))


def test_rules_table_validated_and_batch_claims_its_axes_first():
    config = base_config()
    config.mesh.rules.mlp = "tensor,model"
    with pytest.raises(ConfigError, match=r"mesh.rules.mlp=.*\['model'\]"):
        validate(config)
    config.mesh.rules.mlp = "tensor"
    rules = sharding.axis_rules(config)
    assert rules[0] == ("batch", ("data", "fsdp")) and dict(rules)["length"] is None
    # An activation [batch, length, embed] keeps embed whole; a parameter splits it on fsdp.
    assert tuple(nn.logical_to_mesh_axes(("batch", "length", "embed"), rules)) == (
        ("data", "fsdp"), None, None)
    assert tuple(nn.logical_to_mesh_axes(("embed", "mlp"), rules)) == ("fsdp", "tensor")


@pytest.mark.parametrize("kind", ["copy", "random", "text"])
def test_any_rows_of_a_batch_can_be_built_alone(kind, tmp_path):
    if kind == "text":  # a corpus named directly: prepared into the cache, read by windows
        from transformer import data
        (tmp_path / "t.txt").write_text("".join(f"line {i} of a small text\n" for i in range(400)))
        config = base_config()
        config.model.max_seq_len = 16
        config.data.corpus = str(tmp_path / "t.txt")
        source = data.load(config)[1]
    else:
        source = (batches.CopyTask if kind == "copy" else batches.RandomTokens)(50, 16)
    full = source.batch(3, "train", 7, 8)
    part = source.batch(3, "train", 7, 8, rows=[2, 3, 6])
    for key in full:
        np.testing.assert_array_equal(part[key], full[key][[2, 3, 6]])
    assert not np.array_equal(full["inputs"], source.batch(3, "train", 8, 8)["inputs"])


def test_one_device_rows_and_placement():
    config = base_config()
    mesh = sharding.make_mesh(config.mesh)
    batch_sh = sharding.batch_sharding(mesh, sharding.axis_rules(config))
    np.testing.assert_array_equal(sharding.process_rows(batch_sh, 4, 8), np.arange(4))
    x = sharding.put_batch({"inputs": np.ones((4, 8), np.int32)}, batch_sh, 4)["inputs"]
    assert x.shape == (4, 8) and x.sharding == batch_sh


def test_bad_mesh_flag_is_one_error_line(tmp_path):
    result = fork_run("train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                      "--config.mesh.data=3", "--config.mesh.tensor=2", "--no_progress",
                      cwd=ROOT, env=simulated_devices_env(4), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: mesh.data=3")
    assert "6 devices, but there are 4" in result.stderr


def _matches_one_device(report) -> None:
    """Every mesh of a sharding_check.py report trained, split and decoded as one device did;
    its decode programs never move the KV cache; its checkpoint restored exactly."""
    for shape, r in report["meshes"].items():
        assert r["loss_diff"] <= 1e-5, shape
        assert r["param_diff"] <= 1e-5 and r["opt_diff"] <= 1e-5, shape
        assert r["misplaced"] == [], shape
        assert r.get("decode_same", True), shape
    assert report["decode_one_same"]
    # The KV cache lives where decoding reads and writes it: no step moves it between devices.
    for case, moves in report["cache_moves"].items():
        assert moves == [], (case, moves)
    for target, r in report["restore"].items():
        assert r["identical"] and r["placed"] and r["step"] == 3, target


def test_a_mesh_that_splits_every_axis_matches_one_device(tmp_path):
    """(2, 2, 2) on 8 simulated devices, data, fsdp and tensor each split in two: the losses,
    params, optimizer state and greedy tokens (of 4 prompts and of 1) of one device;
    parameters split as the rules say; the decode program never moves the KV cache (batches
    of 1, 4 and 8 rows); its checkpoint restores exactly onto one device. The default run's
    cheapest form of the check below, which runs every mesh shape (-m slow)."""
    out = tmp_path / "report.json"
    result = fork_run("tests/sharding_check.py", "--one_mesh", out, cwd=ROOT,
                      env=simulated_devices_env(8), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["meshes"]) == {"(2, 2, 2)"} and "decode_same" in report["meshes"]["(2, 2, 2)"]
    assert len(report["cache_moves"]) == 3 and set(report["restore"]) == {"one_device"}
    _matches_one_device(report)


@pytest.fixture(scope="module")
def sharding_reports(tmp_path_factory):
    """One run of tests/sharding_check.py for the two tests below: the 8-device process and
    its backend are paid once (~3 s of CPU), and each test still reads a report of its own,
    written by the same code as when each had a process of its own (the modern check runs
    second, on fresh trainers of its own configs; nothing it compares is shared). A child of
    the fork server (conftest's fork_run: the device count travels in its XLA_FLAGS), so it
    does not import jax, flax and the package again (~3 s of CPU here)."""
    folder = tmp_path_factory.mktemp("sharding")
    out, modern = folder / "report.json", folder / "modern.json"
    result = fork_run("tests/sharding_check.py", out, modern, cwd=ROOT,
                      env=simulated_devices_env(8), timeout=900)
    return result, out, modern


@pytest.mark.slow  # ~45 s of CPU; the default run checks (2, 2, 2) alone (above)
def test_sharded_meshes_match_one_device(sharding_reports):
    """(8,1,1), (1,8,1), (2,2,2), (1,2,4) (and (1,2,4) with the length axis split over tensor:
    sequence parallelism) on 8 simulated devices: same losses, params and
    greedy tokens as one device (with train.optimizer=muon too, on (1,8,1) and (1,2,4)); parameters split as the rules say; a (2,2,2) checkpoint
    restores exactly onto one device and onto (1,2,4); the decode program never moves the KV
    cache between devices (batches of 1, 4 and 8 rows)."""
    result, out, _ = sharding_reports
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["meshes"]) == {"(8, 1, 1)", "(1, 8, 1)", "(2, 2, 2)", "(1, 2, 4)"}
    assert sum("decode_same" in r for r in report["meshes"].values()) >= 2
    # Muon: sharded matrices get the one-device update; and it is not AdamW's.
    muon = report["muon"]
    assert set(muon) == {"moved", "(1, 8, 1)", "(1, 2, 4)"}
    assert muon["moved"] > 1e-3
    for shape in ("(1, 8, 1)", "(1, 2, 4)"):
        assert muon[shape]["loss_diff"] <= 1e-5, shape
        assert muon[shape]["param_diff"] <= 1e-5 and muon[shape]["opt_diff"] <= 1e-5, shape
        assert muon[shape]["misplaced"] == [], shape
    # mesh.rules.length=tensor (sequence parallelism) on (1, 2, 4): the one-device training.
    seq = report["sequence"]
    assert seq["loss_diff"] <= 1e-5 and seq["param_diff"] <= 1e-5 and seq["opt_diff"] <= 1e-5, seq
    assert len(report["cache_moves"]) == 6
    assert set(report["restore"]) == {"one_device", "(1, 2, 4)"}
    _matches_one_device(report)


@pytest.mark.slow  # ~24 s of CPU, three train.py processes (docs/testing.md)
def test_two_processes_match_one_process_of_four_devices(tmp_path):
    """jax.distributed on localhost: 2 processes x 2 CPU devices train like 1 x 4. Each of the
    three is a process of its own, a child of the fork server (conftest's fork_popen, as
    tests/test_multihost.py's processes are): ~1.3-3 s of CPU less each than a new Python."""
    # A text corpus no process has seen: the three processes prepare it into one empty cache
    # at once (one of them does, the others wait for it), then read their rows from it.
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"{i} green ideas sleep furiously\n" for i in range(2000)))
    args = ["train.py", "--config=configs/tiny.py", "--no_progress",
            f"--config.data.corpus={corpus}", "--config.train.steps=3", "--config.train.log_every=1",
            "--config.train.eval_every=3", "--config.train.eval_batches=1",
            "--config.train.ckpt_every=3", "--config.mesh.fsdp=2",
            "--config.sample.max_new_tokens=4",
            # float32 matmuls: the two runs sum gradients across devices in different orders,
            # and bf16 inputs (auto on an AVX512_BF16 CPU) turn those last-bit differences
            # into whole bf16 roundings of the next step (2.3e-5 by step 3 once the head was
            # bf16 too), where this test is about the processes, not the precision.
            "--config.model.matmul=fast_f32"]
    port = free_port()
    cache = {"TRANSFORMER_CACHE": str(tmp_path / "cache")}
    with reaped([fork_popen(args + [f"--workdir={tmp_path / 'multi'}",
                                    f"--coordinator_address=127.0.0.1:{port}",
                                    "--num_processes=2", f"--process_id={i}"],
                            cwd=ROOT, env=simulated_devices_env(2, **cache))
                 for i in range(2)]) as multi:
        single = fork_run(*args, f"--workdir={tmp_path / 'single'}", cwd=ROOT,
                          env=simulated_devices_env(4, **cache), timeout=600)
        outputs = [p.communicate(timeout=600) for p in multi]
    for p, (_, err) in zip(multi, outputs):
        assert p.returncode == 0, err[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]
    assert "data 2 x fsdp 2 x tensor 1 over 4 cpu devices in 2 processes" in outputs[0][0]
    assert len(list((tmp_path / "cache" / "prepared").iterdir())) == 1  # one set, no leftovers
    assert "sample" not in outputs[1][0] and "params:" not in outputs[1][0]  # process 0 speaks

    def losses(workdir):
        lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
        return [x["train_loss"] for x in lines if "train_loss" in x], lines

    multi_losses, multi_lines = losses(tmp_path / "multi")
    single_losses, _ = losses(tmp_path / "single")
    assert len(multi_losses) == 3  # one writer: no line twice
    np.testing.assert_allclose(multi_losses, single_losses, atol=1e-5, rtol=0)
    assert (tmp_path / "multi" / "checkpoints" / "3").is_dir()


@pytest.mark.slow  # a variant of the check above, in its process
def test_the_modern_pieces_sharded_match_one_device(sharding_reports):
    """QK-norm, ReLU², no biases, soft-cap, untied head, padded ids and the z-loss on a
    (2, 2, 2) mesh of 8 simulated devices: the losses, parameters and
    greedy tokens of one device, parameters split as the rules say, no padding id decoded."""
    result, _, out = sharding_reports
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["loss_diff"] <= 1e-5 and report["param_diff"] <= 1e-5, report
    assert report["misplaced"] == [] and report["decode_same"], report
    assert report["max_token"] < 61


@pytest.mark.slow  # end to end; in process: test_variants' vocab_zero test
def test_train_py_pads_vocab_zero_for_a_tensor_mesh_and_a_resume_keeps_it(tmp_path):
    """python train.py on mesh.tensor=2 with text's 257 ids used to stop at start-up until the
    vocabulary was padded by hand: it now trains 258 rows and samples at the end; resumed on one
    device, the run keeps its 258 (vocab_size=0 would give 257 there)."""
    common = ["train.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
              "--config.data.max_bytes=50000", "--config.train.eval_every=1",
              "--config.train.eval_batches=1", "--config.sample.max_new_tokens=4"]
    first = fork_run(*common, "--config.mesh.tensor=2", "--config.train.steps=1", cwd=ROOT,
                     env=simulated_devices_env(2), timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "--- sample" in first.stdout
    second = fork_run(*common, "--config.train.steps=2", "--allow_change=train.steps", cwd=ROOT,
                      env=simulated_devices_env(1), timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from step 1" in second.stdout and "--- sample" in second.stdout
    from transformer import checkpoint
    ckpts = checkpoint.Checkpoints(tmp_path / "run", read_only=True)
    saved = ckpts.read_meta()["config"]["model"]  # the newest checkpoint's
    ckpts.close()
    assert (saved["vocab_size"], saved["vocab_used"]) == (258, 257)


def test_a_vocabulary_the_mesh_cannot_split_evenly_is_refused_naming_the_padded_size():
    """257 ids (256 bytes and the end-of-text token) on mesh.tensor=2: the error names the
    padded size that fits, and that size (or keeping the vocabulary whole) is accepted."""
    from types import SimpleNamespace

    from transformer import config as config_lib
    from transformer.config import ConfigError
    mesh = SimpleNamespace(shape={"data": 2, "fsdp": 2, "tensor": 2})
    config = config_lib.replace(base_config(), **{"model.vocab_size": 257})
    with pytest.raises(ConfigError, match=r"--config\.model\.vocab_size=258 .*rules\.vocab="):
        sharding.check_fits(config, mesh)
    sharding.check_fits(config_lib.replace(config, **{"model.vocab_size": 258}), mesh)
    whole = config_lib.replace(config, **{"mesh.rules.vocab": ""})
    sharding.check_fits(whole, mesh)


def test_a_model_the_mesh_cannot_split_is_refused_before_the_workdir_is_written(tmp_path):
    """A batch of 3 rows on 2 devices (mesh.data=-1): one error line naming the numbers, exit
    2, and the workdir not even created (bad input is refused before anything is written)."""
    workdir = tmp_path / "run"
    out = fork_run("train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
                   "--config.data.max_bytes=50000", "--config.train.batch_size=3",
                   "--no_progress", cwd=ROOT, env=simulated_devices_env(2), timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: train.batch_size=3 is not divisible by 2"), line
    assert not workdir.exists()


def _one_step_args(workdir):
    return ["train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
            "--config.data.max_bytes=50000", "--config.train.eval_every=1",
            "--config.train.eval_batches=1", "--config.sample.max_new_tokens=0",
            "--no_progress"]


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A tiny run trained one step on one device, once for the module: the two tests below
    each resume a copy of its workdir of their own (a run is not tied to its folder's path:
    tests/test_resume.py resumes copies too)."""
    workdir = tmp_path_factory.mktemp("one_step") / "run"
    first = fork_run(*_one_step_args(workdir), "--config.train.steps=1", cwd=ROOT,
                     env=simulated_devices_env(1), timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    return workdir


def _one_step_on_one_device(tmp_path, one_step_run):
    """A copy of the one-step run in tmp_path: (its workdir, the arguments it ran with)."""
    workdir = tmp_path / "run"
    shutil.copytree(one_step_run, workdir)
    return workdir, _one_step_args(workdir)


def test_a_resume_on_a_mesh_that_cannot_split_the_saved_model_is_refused_not_damage(
        tmp_path, one_step_run):
    """Trained on one device with text's 257 ids (vocab_size=0: nothing to pad for), resumed
    on mesh.tensor=2, which cannot split the checkpoint's 257 rows: one error line naming the
    size and a fix that keeps the checkpoint (another mesh, or the vocabulary kept whole), exit
    2, no checkpoint called damaged or moved aside; and that fix then resumes the run."""
    workdir, common = _one_step_on_one_device(tmp_path, one_step_run)
    more = ["--config.train.steps=2", "--allow_change=train.steps", "--config.mesh.tensor=2"]
    second = fork_run(*common, *more, cwd=ROOT, env=simulated_devices_env(2), timeout=300)
    assert second.returncode == 2, second.stderr[-2000:]
    [line] = second.stderr.strip().splitlines()
    assert line.startswith("error: model.vocab_size=257 is not divisible by 2"), line
    assert "--config.mesh.rules.vocab=" in line and "damaged" not in second.stderr
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
    assert not (workdir / "checkpoints-damaged").exists()
    third = fork_run(*common, *more, "--config.mesh.rules.vocab=", cwd=ROOT,
                     env=simulated_devices_env(2), timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "resuming from step 1" in third.stdout


def test_a_resume_may_change_the_batch_to_one_the_new_mesh_splits(tmp_path, one_step_run):
    """Trained with batch 8 on one device, resumed on 3 devices with batch 6
    (--allow_change=train.batch_size): no saved array depends on the batch, so the run
    resumes; the old batch of 8, which 3 devices cannot split, is no reason to refuse it."""
    workdir, common = _one_step_on_one_device(tmp_path, one_step_run)
    second = fork_run(*common, "--config.train.steps=2", "--config.train.batch_size=6",
                      "--allow_change=train.steps,train.batch_size", cwd=ROOT,
                      env=simulated_devices_env(3), timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from step 1" in second.stdout and "damaged" not in second.stderr

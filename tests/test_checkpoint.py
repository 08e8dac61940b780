"""checkpoint.py: a save reads back bit for bit; damage is told apart from a failed read;
several processes restore the same step.

Small trees of random arrays stand in for a model (constant arrays would hide truncation:
they compress to nothing)."""

import errno

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import checkpoint
from transformer.checkpoint import CheckpointError, Checkpoints, TransientReadError
from transformer.parallel import processes
from transformer.train import workdir as workdir_lib


def _tree(seed):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(64, 64)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(64,)), jnp.bfloat16)}


def _abstract(meta):
    shapes = jax.eval_shape(lambda: _tree(0))
    return shapes, {"step": jax.ShapeDtypeStruct((), jnp.int32)}


@pytest.fixture()
def workdir(tmp_path):
    """Checkpoints of steps 1 and 2, each with different arrays."""
    ckpts = Checkpoints(tmp_path, keep=5)
    for step in (1, 2):
        ckpts.save(step, _tree(step), {"step": jnp.int32(step)}, {"step": step})
    ckpts.wait()
    ckpts.close()
    return tmp_path


def _restore(workdir, **kwargs):
    ckpts = Checkpoints(workdir, read_only=True)
    try:
        return ckpts.restore_good(_abstract, **kwargs)
    finally:
        ckpts.close()


def _same(a, b):
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _truncate(workdir, step):
    for f in (checkpoint.directory(workdir) / str(step) / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 64:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_the_newest_checkpoint_reads_back_bit_for_bit(workdir):
    found = _restore(workdir)
    assert found.step == 2 and found.meta["step"] == 2 and int(found.train["step"]) == 2
    assert _same(found.params, _tree(2)) and not _same(found.params, _tree(1))
    assert _same(_restore(workdir, step=1).params, _tree(1))


def test_a_truncated_checkpoint_is_damaged_and_the_previous_one_is_used(workdir, capsys):
    _truncate(workdir, 2)
    damaged = []
    found = _restore(workdir, on_damaged=damaged.append)
    assert found.step == 1 and _same(found.params, _tree(1))
    assert damaged == [2] and "checkpoint 2" in capsys.readouterr().err


def test_arrays_that_do_not_match_their_fingerprint_are_damage(workdir, monkeypatch):
    real = checkpoint.fingerprint
    monkeypatch.setattr(checkpoint, "fingerprint", lambda tree: [v + 1 for v in real(tree)])
    damaged = []
    with pytest.raises(CheckpointError, match="fingerprint"):
        _restore(workdir, on_damaged=damaged.append)
    assert damaged == [2, 1]


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"),
                                   PermissionError(errno.EACCES, "Permission denied"),
                                   MemoryError("out of memory")])
def test_a_failed_read_is_not_damage_and_leaves_the_checkpoint_alone(workdir, monkeypatch,
                                                                     error):
    real = Checkpoints.restore

    def flaky(self, step, *args):
        if step == 2:
            raise RuntimeError("while restoring") from error  # as wrapped by a library
        return real(self, step, *args)

    monkeypatch.setattr(Checkpoints, "restore", flaky)
    damaged = []
    with pytest.raises(TransientReadError, match="could not read checkpoint 2.*not damage"):
        _restore(workdir, on_damaged=damaged.append)
    assert damaged == []
    monkeypatch.undo()
    assert _restore(workdir).step == 2  # still there, still whole


def test_missing_files_are_damage_not_a_failed_read(workdir):
    for f in (checkpoint.directory(workdir) / "2" / "params").rglob("*"):
        if f.is_file():
            f.unlink()
    damaged = []
    assert _restore(workdir, on_damaged=damaged.append).step == 1 and damaged == [2]


def test_every_process_restores_the_step_all_of_them_could_read(workdir, monkeypatch):
    """Another process found checkpoint 2 damaged, this one reads it fine: both take step 1
    (the agreed verdict is the worst one), and both mark 2 damaged."""
    other_verdicts = {2: checkpoint.DAMAGED, 1: checkpoint.OK}
    steps_read = []
    real = Checkpoints._restore_checked

    def read(self, step, make_abstract):
        steps_read.append(step)
        return real(self, step, make_abstract)

    monkeypatch.setattr(Checkpoints, "_restore_checked", read)
    monkeypatch.setattr(processes, "max_over_processes",
                        lambda v: max(v, other_verdicts[steps_read[-1]]))
    damaged = []
    found = _restore(workdir, on_damaged=damaged.append)
    assert found.step == 1 and damaged == [2] and _same(found.params, _tree(1))


def test_every_process_refuses_a_workdir_changed_while_it_started(workdir, monkeypatch):
    """After the lock, a newer checkpoint that one process sees (another run saved it) stops
    every process, not that one alone (the others would wait at the next barrier forever);
    with nothing new seen anywhere, all go on."""
    from types import SimpleNamespace

    from transformer.train import start

    plan = SimpleNamespace(workdir=workdir, found=SimpleNamespace(step=2), damaged=[])
    for other in (0, 1):  # what the other process saw
        monkeypatch.setattr(processes, "max_over_processes", lambda v, o=other: max(v, o))
        if other:
            with pytest.raises(workdir_lib.WorkdirError, match="another process saw it"):
                start._check_unchanged(plan)
        else:
            start._check_unchanged(plan)  # this one saw nothing new either: no error
    plan.found.step = 1  # this process sees step 2 as new: refused, whatever the others saw
    monkeypatch.setattr(processes, "max_over_processes", lambda v: v)
    with pytest.raises(workdir_lib.WorkdirError, match="while this one started; run again"):
        start._check_unchanged(plan)


def test_a_step_that_does_not_exist_names_the_ones_that_do(workdir):
    with pytest.raises(CheckpointError, match=r"step=7: no such checkpoint .*steps saved: 1, 2"):
        _restore(workdir, step=7)


def test_quarantine_moves_a_step_aside_and_it_can_be_saved_again(workdir):
    target = checkpoint.quarantine(workdir, 2)
    assert target == checkpoint.quarantine_directory(workdir) / "2" and target.is_dir()
    ckpts = Checkpoints(workdir, keep=5)
    assert ckpts.all_steps() == [1]
    ckpts.save(2, _tree(3), {"step": jnp.int32(2)}, {"step": 2})
    ckpts.wait()
    ckpts.close()
    assert _same(_restore(workdir).params, _tree(3))


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(workdir_lib.WorkdirError, match="is a file, not a folder"):
        workdir_lib.check_writable(path)
    workdir_lib.check_writable(tmp_path / "new" / "run")
    assert (tmp_path / "new" / "run").is_dir()


def test_a_fingerprint_changes_when_one_bit_does():
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    flipped = x.copy().view(np.uint32)
    flipped[3, 5] ^= 1
    assert checkpoint.fingerprint([x]) != checkpoint.fingerprint([flipped.view(np.float32)])
    assert checkpoint.fingerprint([x]) == checkpoint.fingerprint([jnp.asarray(x)])

"""What a checkpoint holds, and how to write it, find the latest good one and read it back.

A checkpoint of step N lives in `<workdir>/checkpoints/N/` with three items:
    params   the model parameters
    train    {'step', 'opt_state'}: everything else training needs to continue
    meta     JSON: the step, the resolved config, the tokenizer, and a fingerprint of the
             params and train items, so that `sample.py` rebuilds the model from the
             checkpoint alone and a reader can tell a damaged checkpoint from a good one

Why a run survives being killed at any moment (orbax-checkpoint's guarantees, checked in
tests/test_resume.py):
- a save is written into `N.orbax-checkpoint-tmp-*` and renamed to `N` only when complete,
  so `N` exists only once whole; leftover tmp folders are removed when a writer opens;
- old checkpoints (beyond `keep`) are deleted only after the newer one has been renamed;
- a latest checkpoint that cannot be read, or whose arrays do not match their fingerprint
  (truncated or corrupted files), is reported and the previous good one is used; a read that
  failed for a reason outside the files (an I/O error, memory) stops the reader instead, and
  leaves that checkpoint alone;
- on several processes every process restores the same step (they agree on each verdict):

    ckpts = Checkpoints(workdir, keep=3)
    ckpts.save(step, params, {"step": step_array, "opt_state": opt_state}, meta)
    found = ckpts.restore_good(lambda meta: (abstract_params, abstract_train))
    found.step, found.meta, found.params, found.train
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from transformer.parallel import processes


class _MetadataNoise(logging.Filter):
    """Orbax logs an unreadable _CHECKPOINT_METADATA file ("ERROR:absl:Failed to json parse
    Metadata file: ...") each time it lists the steps, several lines of it, and then restores
    the step anyway (that file only holds a timestamp) or raises what this module words as
    its one warning or error line: noise on stderr in either case, not in the CLI's form."""

    def filter(self, record):
        return not str(record.msg).startswith("Failed to json parse Metadata file")


logging.getLogger("absl").addFilter(_MetadataNoise())


class CheckpointError(ValueError):
    """No usable checkpoint where one was expected."""


class TransientReadError(CheckpointError):
    """A checkpoint could not be read for a reason outside its files (I/O, memory)."""


# What one process found when it read a checkpoint; processes agree on the largest.
OK, DAMAGED, GONE, TRANSIENT = 0, 1, 2, 3
# Errors that say a file is missing: the checkpoint is incomplete, hence damaged.
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def is_transient(error: BaseException) -> bool:
    """Whether a failed read says nothing about the checkpoint's files: memory ran out, or the
    operating system failed an I/O call (EIO, EACCES, ENOSPC, a lost network mount, ...).
    Such a checkpoint may be whole; it must not be moved aside as damaged. Missing files,
    undecodable contents, a wrong structure and a fingerprint mismatch are damage."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MemoryError):
            return True
        if isinstance(error, OSError) and not isinstance(error, _MISSING):
            return True
        error = error.__cause__
    return False


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def directory(workdir) -> Path:
    return Path(workdir).absolute() / "checkpoints"


def quarantine_directory(workdir) -> Path:
    """Where damaged checkpoints are moved (kept for inspection, out of orbax's sight)."""
    return Path(workdir).absolute() / "checkpoints-damaged"


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Restored:
    step: int
    meta: dict
    params: Any
    train: Any  # None when only params were asked for


def _bits_u32(x):
    if x.dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    small = {2: jnp.uint16, 1: jnp.uint8}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, small).astype(jnp.uint32)


@jax.jit
def _leaf_fingerprints(leaves):
    # Sum of each element's bits times an odd position weight, wrapping in uint32: integer
    # addition is associative, so the value is the same on any device layout or sharding.
    out = []
    for x in leaves:
        bits = _bits_u32(jnp.asarray(x)).reshape(-1)
        weight = jnp.arange(bits.size, dtype=jnp.uint32) * 2 + 1
        out.append(jnp.sum(bits * weight, dtype=jnp.uint32))
    return out


def precompile_fingerprint(tree) -> None:
    """Compiles `fingerprint` for trees shaped and sharded like `tree` (arrays or
    jax.ShapeDtypeStructs), so that a save finds it compiled (run.py, in a thread)."""
    _leaf_fingerprints.lower(jax.tree.leaves(tree)).compile()


def fingerprint(tree) -> list[int]:
    """One integer per leaf that changes when any bit of the leaf changes (almost surely)."""
    return [int(v) for v in jax.device_get(_leaf_fingerprints(jax.tree.leaves(tree)))]


_LOOK_AGAIN = object()  # `_first_good`'s answer when a checkpoint vanished while read


class Checkpoints:
    """The checkpoints of one workdir. `read_only=True` for readers such as sample.py."""

    def __init__(self, workdir, keep: int = 3, read_only: bool = False):
        self.workdir = Path(workdir)
        path = directory(workdir)
        if read_only and not path.is_dir():
            raise CheckpointError(f"{workdir}: no checkpoints folder; train a model there first "
                                  f"(python train.py --workdir={workdir})")
        # A reader on several processes reads alone: orbax ends every restore with a barrier
        # across processes, which a process whose read failed never reaches, so the others
        # would wait forever. Readers agree through restore_good's verdicts instead.
        alone = ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()}) \
            if read_only and processes.several() else ocp.options.MultiprocessingOptions()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, read_only=read_only,
            cleanup_tmp_directories=not read_only,  # a killed save leaves a tmp folder behind
            multiprocessing_options=alone)
        self._manager = ocp.CheckpointManager(path, options=options,
                                              item_names=("params", "train", "meta"))
        self.read_only = read_only

    def latest_step(self):
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        self._manager.reload()  # another process may have saved since we looked
        return sorted(self._manager.all_steps())

    def save(self, step: int, params, train_state, meta: dict) -> None:
        """Starts an asynchronous save; the arrays are copied off the device before it returns."""
        meta = {**meta, "fingerprint": {"params": fingerprint(params),
                                        "train": fingerprint(train_state)}}
        self._manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train=ocp.args.StandardSave(train_state),
            meta=ocp.args.JsonSave(meta)))

    def read_meta(self, step=None) -> dict:
        step = self._require(step)
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        return self._manager.restore(step, args=args)["meta"]

    def restore(self, step, abstract_params, abstract_train=None):
        """(params, train_state) at `step`; pass abstract trees (jax.ShapeDtypeStruct leaves,
        with shardings to restore onto a mesh). Without abstract_train only params are read."""
        step = self._require(step)
        items = {"params": ocp.args.StandardRestore(abstract_params)}
        if abstract_train is not None:
            items["train"] = ocp.args.StandardRestore(abstract_train)
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        return out["params"], out.get("train") if abstract_train is not None else None

    def restore_good(self, make_abstract: Callable[[dict], tuple], step=None,
                     on_damaged: Callable[[int], None] | None = None) -> Restored:
        """The newest checkpoint that reads back whole and matches its fingerprint.

        make_abstract(meta) -> (abstract_params, abstract_train or None). A damaged checkpoint
        is reported with a warning and the one before it is tried; `on_damaged(step)` is called
        for each (a writer moves it aside). With `step` given, only that one is tried.

        A read that fails for a reason outside the files (I/O error, out of memory: see
        `is_transient`) raises TransientReadError and marks nothing damaged. On several
        processes all of them try the same steps (process 0's list) and agree on each verdict,
        so every process restores the same step or all raise the same error."""
        for _ in range(4):  # a checkpoint deleted while read (by a trainer's `keep`): look again
            steps = self._candidates(step)
            found = self._first_good(steps, make_abstract, single=step is not None,
                                     on_damaged=on_damaged)
            if found is not _LOOK_AGAIN:
                return found
        raise CheckpointError(f"{self.workdir}: checkpoints keep disappearing while read; "
                              "is another program deleting them?")

    def _candidates(self, step) -> list[int]:
        have = processes.from_process_0(self.all_steps())
        if step is not None and step not in have:
            raise CheckpointError(f"step={step}: no such checkpoint in {self.workdir} "
                                  f"(steps saved: {', '.join(map(str, have)) or 'none'})")
        if not have:
            raise CheckpointError(f"{self.workdir}: no checkpoint yet; train first, "
                                  "or wait for the first save")
        return [step] if step is not None else have[::-1]

    def _first_good(self, steps, make_abstract, single: bool, on_damaged):
        reasons = []
        for i, s in enumerate(steps):
            error, found = None, None
            try:
                found = self._restore_checked(s, make_abstract)
            except Exception as e:  # noqa: BLE001 -- classified below, then agreed on
                error = e
            verdict = processes.max_over_processes(self._verdict(s, error, single))
            if verdict == OK:
                return found
            if verdict == GONE:
                return _LOOK_AGAIN
            if verdict == TRANSIENT:
                cause = _one_line(error) if error is not None else "on another process"
                raise TransientReadError(
                    f"{self.workdir}: could not read checkpoint {s} ({cause}); this is not "
                    "damage in the checkpoint, which is left as it is: run again") from error
            reason = _one_line(error) if error is not None else "damaged on another process"
            reasons.append(f"step {s}: {reason}")
            if not single and i + 1 < len(steps):
                warn(f"checkpoint {s} in {self.workdir} is damaged ({reason}); "
                     f"using checkpoint {steps[i + 1]} instead")
            if on_damaged is not None:
                on_damaged(s)
        raise CheckpointError(f"{self.workdir}: no readable checkpoint ({'; '.join(reasons)})")

    def _verdict(self, step: int, error, single: bool) -> int:
        if error is None:
            return OK
        if is_transient(error):
            return TRANSIENT
        if not single and step not in self.all_steps():
            return GONE
        return DAMAGED

    def _restore_checked(self, step: int, make_abstract) -> Restored:
        meta = self.read_meta(step)
        abstract_params, abstract_train = make_abstract(meta)
        params, train = self.restore(step, abstract_params, abstract_train)
        expected = meta.get("fingerprint")
        if expected is not None:
            if fingerprint(params) != expected["params"]:
                raise CheckpointError("params do not match their fingerprint")
            if train is not None and fingerprint(train) != expected["train"]:
                raise CheckpointError("optimizer state does not match its fingerprint")
        return Restored(step, meta, params, train)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def _require(self, step):
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self._manager.directory}: no checkpoint yet; "
                                  "train first, or wait for the first save")
        return step


def quarantine(workdir, step: int) -> Path:
    """Moves a damaged checkpoint out of the way (before a writer opens the folder), so the
    run can save that step again; kept for inspection."""
    target = quarantine_directory(workdir) / str(step)
    target.parent.mkdir(exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(directory(workdir) / str(step), target)
    warn(f"moved damaged checkpoint {step} to {target}")
    return target


@dataclasses.dataclass
class LoadedRun:
    """A run's checkpoint on one device, ready to sample from or look inside."""

    step: int
    config: Any         # the validated run config, `model.matmul` concrete
    model_config: Any   # ModelConfig of config
    params: Any
    tokenizer: Any
    meta: dict


def load_run(workdir, step=None, check=None) -> LoadedRun:
    """The newest good checkpoint of the run in `workdir` (or checkpoint `step`), its params
    restored onto one device whatever mesh wrote it: the one way sample.py, export, visualize,
    explain (and the server) read a run. Fingerprints are checked; a damaged newest checkpoint
    is skipped with a warning for the one before it. `check(model_config)`, if given, may
    refuse the run before anything is restored (an error raised while restoring reads as
    damage). Only committed checkpoints are visible, so this is safe while a run trains there.
    """
    from transformer import config as config_lib
    from transformer.config import ModelConfig
    from transformer.data import tokenizers
    from transformer.model.gpt import init_params
    from transformer.parallel import target as target_lib

    def model_config_of(meta):
        return ModelConfig.from_config(config_lib.from_dict(meta["config"]))

    def abstract(meta):
        # Onto one device: the target names the placement, whatever mesh wrote it.
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shapes = jax.eval_shape(lambda: init_params(model_config_of(meta), jax.random.key(0)))
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                            shapes), None

    ckpts = Checkpoints(workdir, read_only=True)
    try:
        steps = ckpts.all_steps()
        if check is not None and steps and (step is None or step in steps):
            try:
                early = model_config_of(ckpts.read_meta(step))
            except Exception:  # noqa: BLE001 -- damaged: restore_good says so, or falls back
                early = None
            if early is not None:
                check(early)
        found = ckpts.restore_good(abstract, step=step)
    finally:
        ckpts.close()
    if check is not None:  # the step restored (an older one, when the newest was damaged)
        check(model_config_of(found.meta))
    # The mode the run trained in; a checkpoint saved before modes were resolved says auto.
    config, _ = target_lib.resolve_matmul(config_lib.from_dict(found.meta["config"]))
    return LoadedRun(found.step, config, ModelConfig.from_config(config), found.params,
                     tokenizers.from_json(found.meta["tokenizer"]), found.meta)

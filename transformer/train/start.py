"""Where a run starts: a fresh state, or the newest good checkpoint in its workdir.

    plan = prepare(config, workdir, mesh, allow_change)   reads only; every check that needs no
                                                          write (config, corpus, checkpoint,
                                                          a changed config) fails here first
    with claim(plan):                                     the first writes: lock, damaged aside
        state, skipped = initial_state(trainer, plan)     restored, or created fresh

On several processes every process reads, and they agree on what they found (the step to
restore, which checkpoints are damaged: checkpoint.restore_good) before any of them writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import jax

from transformer import config as config_lib
from transformer import data
from transformer.config import ConfigError, resume
from transformer.hf import load as hf_import
from transformer.parallel import processes
from transformer.train import checkpoint
from transformer.train.trainer import Trainer, TrainState, resolve
from transformer.train.workdir import WorkdirLock


@dataclasses.dataclass
class Plan:
    """What a run found before writing anything."""

    workdir: Path
    config: Any                       # validated, derived values filled in
    tokenizer: Any
    source: Any                       # the batches (data.load)
    found: checkpoint.Restored | None  # the checkpoint to continue from
    damaged: list[int]                # steps to move aside before saving again


def abstract_checkpoint(config, mesh=None):
    """The abstract (params, train item) of a run with this config on `mesh`: shapes, dtypes
    and shardings, what a restore reads into."""
    abstract = Trainer.build(config, mesh).abstract_state()
    return abstract.params, {"step": abstract.step, "opt_state": abstract.opt_state}


def find_checkpoint(workdir, config, mesh=None):
    """(the newest good checkpoint or None, steps found damaged); reads, never writes.
    Restores onto `mesh` with this config's sharding rules (a run may resume on another mesh)."""
    if not checkpoint.directory(workdir).is_dir():
        return None, []
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    if not processes.from_process_0(ckpts.all_steps()):
        return None, []
    here = config_lib.to_dict(config)["mesh"]
    damaged = []
    try:
        found = ckpts.restore_good(
            lambda meta: abstract_checkpoint(
                config_lib.from_dict({**meta["config"], "mesh": here}), mesh),
            on_damaged=damaged.append)
    finally:
        ckpts.close()
    return found, damaged


def prepare(config, workdir, mesh, allow_change=()) -> Plan:
    WorkdirLock(workdir).check_free()  # a run in progress there: refused before reading it
    found, damaged = find_checkpoint(workdir, config, mesh)
    if found:
        saved_tokenizer = data.tokenizers.from_json(found.meta["tokenizer"])
    else:  # checks init_from; a None tokenizer: data.tokenizer decides
        config, saved_tokenizer = hf_import.prepare(config)
    tokenizer, source = data.load(config, saved_tokenizer)  # bad data fails before any write
    config = resolve(config, tokenizer)
    if found:
        diffs = resume.differences(found.meta["config"], config_lib.to_dict(config))
        resume.check(diffs, allow_change, workdir)
        if found.step > config.train.steps:  # nothing to train, and no way to untrain
            raise ConfigError(f"train.steps={config.train.steps} is below the checkpoint's step "
                              f"{found.step} in {workdir}: pass train.steps >= {found.step} "
                              "to continue, or sample.py --step=N for an older checkpoint")
    return Plan(Path(workdir), config, tokenizer, source, found, damaged)


@contextlib.contextmanager
def claim(plan: Plan):
    """Makes the workdir this run's: writable, locked against a second run, damaged
    checkpoints moved aside (so that this run can save those steps again)."""
    workdir = plan.workdir
    processes.barrier("workdir read")  # no process writes before every one has read it
    checkpoint.check_writable(workdir)  # the first write to the workdir
    with WorkdirLock(workdir):
        _check_unchanged(plan)
        for step in plan.damaged if jax.process_index() == 0 else ():
            checkpoint.quarantine(workdir, step)
        processes.barrier("damaged checkpoints moved")
        yield


def _check_unchanged(plan: Plan) -> None:
    """The workdir was read before it was locked: a run that ended in between may have saved."""
    folder = checkpoint.directory(plan.workdir)
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    newest = plan.found.step if plan.found else 0
    if any(s > newest and s not in plan.damaged for s in steps):
        raise checkpoint.WorkdirError(f"--workdir={plan.workdir}: another run saved a "
                                      "checkpoint there while this one started; run again")


def initial_state(trainer: Trainer, plan: Plan) -> tuple[TrainState, int]:
    """(state, steps skipped so far): the checkpoint's, or a fresh state (the one place one is
    created)."""
    if plan.found is None:  # random, or train.init_from
        return hf_import.fresh_state(trainer, plan.config.train.seed), 0
    found = plan.found
    state = TrainState(found.train["step"], found.params, found.train["opt_state"])
    if jax.tree.structure(state) != jax.tree.structure(trainer.abstract_state()):
        raise ConfigError(f"{plan.workdir}: the allowed config change alters the optimizer "
                          "state's layout (train.grad_clip on/off?); use a new --workdir")
    return state, found.meta.get("skipped_steps", 0)

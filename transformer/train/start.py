"""Where a run starts: `prepare` works each value out once, in the order the run needs them,
and hands them on as one `Run`; `claim` makes the first write.

    run = prepare(config, workdir, allow_change=...)     reads only, top to bottom:
        the config     validated (unless its caller did: train.py, see `prepare`)
        the mesh       made once per process (or the caller's)
        the config     model.depth derived, `auto` fields made concrete (resolve.py)
        the state      the newest good checkpoint to continue from, a resumed model's sizes
                       checked against the mesh before any checkpoint is read (find_checkpoint)
        the data       the corpus, with the checkpoint's or train.init_from's tokenizer
        the config     vocab_size=0 from the tokenizer (resolve.py), the resume rules, a
                       fresh model's sizes checked against the mesh
    with claim(run):                                     the first writes: lock, damaged aside
        state, skipped = initial_state(trainer, run)     restored, imported (train.init_from) or
                                                         fresh: the one place a state is made

Every check that needs no write fails in `prepare`, so a refused run leaves its workdir as it
was. On several processes every process reads, and they agree on what they found (the step to
restore, which checkpoints are damaged: checkpoint.restore_good) before any of them writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from transformer import checkpoint, data
from transformer import config as config_lib
from transformer.config import ConfigError, resume
from transformer.hf import load as hf_load
from transformer.config import ModelConfig
from transformer.model.kernels import auto
from transformer.parallel import processes, sharding
from transformer.train import workdir as workdir_lib
from transformer.train.resolve import resolve
from transformer.train.optimizer import make_optimizer
from transformer.train.trainer import Trainer, TrainState, layout
from transformer.train.workdir import WorkdirLock


@dataclasses.dataclass
class Run:
    """What a run's start worked out, each value once, before writing anything: the loop, the
    checkpoints' meta and train.py's sample after training read it, and work none of it out
    again."""

    workdir: Path
    config: Any                       # validated, `auto` concrete, derived values filled in
    matmul: auto.Choice               # what model.matmul is, and why
    mesh: jax.sharding.Mesh           # made once per process
    tokenizer: Any
    source: Any                       # the batches (data.load)
    found: checkpoint.Restored | None  # the checkpoint to continue from
    damaged: list[int]                # steps to move aside before saving again
    changes: dict                     # vs the checkpoint's config
    began: float                      # time.perf_counter() at this invocation's start

    @property
    def tokens_trained(self) -> int:
        """Tokens trained through the checkpoint it continues (0 for a fresh run): saved with
        it, as the batch size may have changed on a resume; a checkpoint saved before that
        counts its steps at the batch of the config it was saved with."""
        if self.found is None:
            return 0
        if "tokens" in self.found.meta:
            return int(self.found.meta["tokens"])
        saved = self.found.meta["config"]
        return self.found.step * saved["train"]["batch_size"] * saved["model"]["max_seq_len"]


def abstract_checkpoint(config, mesh):
    """The abstract (params, train item) of a run with this config on `mesh`: shapes, dtypes
    and shardings from jax.eval_shape (trainer.layout, as Trainer.build places the state), what
    a restore reads into."""
    abstract = layout(ModelConfig.from_config(config),
                      make_optimizer(config.train, config.model.d_model), mesh,
                      sharding.axis_rules(config))
    return abstract.params, {"step": abstract.step, "opt_state": abstract.opt_state}


def find_checkpoint(workdir, config, mesh):
    """(the newest good checkpoint or None, steps found damaged); reads, never writes.
    Restores onto `mesh` with this config's sharding rules (a run may resume on another mesh),
    once the mesh is known to split the saved model: a resumed run's one fit check."""
    if not checkpoint.directory(workdir).is_dir():
        return None, []
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    steps = processes.from_process_0(ckpts.all_steps())
    if not steps:
        return None, []
    here = config_lib.to_dict(config)["mesh"]
    # The saved state's layout, on this mesh, with this run's batch (it shapes no saved array
    # and may change on resume): what this run will split.
    batch = {"train.batch_size": config.train.batch_size,
             "train.grad_accum": config.train.grad_accum}

    def on_this_mesh(saved: dict):
        return config_lib.replace(config_lib.from_dict({**saved, "mesh": here}), **batch)

    damaged = []
    try:
        _check_fits_checkpoint(ckpts, steps, on_this_mesh, mesh, workdir)
        found = ckpts.restore_good(
            lambda meta: abstract_checkpoint(on_this_mesh(meta["config"]), mesh),
            on_damaged=damaged.append)
    finally:
        ckpts.close()
    return found, damaged


def _check_fits_checkpoint(ckpts, steps: list[int], on_this_mesh, mesh, workdir) -> None:
    """Refuses in one line a mesh that cannot split the saved model (its sizes are the
    checkpoint's: a vocabulary padded for another mesh, heads; the same in all of a run's
    checkpoints, resume.FIXED), as the newest meta that reads says them: restoring would fail
    in every checkpoint alike, and restore_good would report each as damaged. Processes
    agree; with no meta that reads, restore_good has nothing to restore and says so."""
    error, config = None, None
    for step in reversed(steps):
        try:
            config = on_this_mesh(ckpts.read_meta(step)["config"])
            break
        except Exception:  # noqa: BLE001 -- damaged: restore_good says so, and falls back
            continue
    if config is not None:
        try:
            sharding.check_fits(config, mesh, checkpoint=workdir)
        except ConfigError as e:
            error = e
    if processes.max_over_processes(int(error is not None)):
        raise ConfigError(str(error) if error is not None else f"{workdir}: its checkpoint "
                          "does not fit this mesh (another process says why)")


def prepare(config, workdir, mesh=None, allow_change=(), *, validated: bool = False) -> Run:
    """The run in `workdir` worked out from `config`, reading only (the module docstring's
    order: config, mesh, checkpoint, data, derived values), everything that needs no write
    checked. `mesh`: default, the one config.mesh describes over every device.

    The config is validated here unless the caller says it did (`validated=True`): train.py
    validates before it imports jax, so that a bad value is refused in a blink, and hands the
    validated config on; a library caller (tests, scaling sweeps) hands a raw one."""
    began = time.perf_counter()
    resume.check_names(allow_change)
    config = config if validated else config_lib.validate(config)  # before the mesh reads it
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    config, matmul = resolve(config, mesh=mesh, validated=True)  # vocab_size once data says
    WorkdirLock(workdir).check_free()  # a run in progress there: refused before reading it
    found, damaged = find_checkpoint(workdir, config, mesh)
    if found:  # the run's own tokenizer, saved with it
        tokenizer = data.tokenizers.from_json(found.meta["tokenizer"])
    else:
        config, tokenizer = _init_from(config)  # None: data.tokenizer decides
    tokenizer, source = data.load(config, tokenizer)  # bad data fails before any write
    config, _ = resolve(config, tokenizer=tokenizer, mesh=mesh, validated=True,
                        saved=found.meta["config"] if found else None)
    diffs = {}
    if found:
        diffs = resume.differences(found.meta["config"], config_lib.to_dict(config))
        resume.check(diffs, allow_change, workdir)
        if found.step > config.train.steps:  # nothing to train, and no way to untrain
            raise ConfigError(f"train.steps={config.train.steps} is below the checkpoint's step "
                              f"{found.step} in {workdir}: pass train.steps >= {found.step} "
                              "to continue, or sample.py --step=N for an older checkpoint")
    else:  # sizes the mesh cannot split, refused before claim() writes the workdir (a
        # resumed model's are its checkpoint's, checked in find_checkpoint before reading it)
        sharding.check_fits(config, mesh)
    return Run(Path(workdir), config, matmul, mesh, tokenizer, source, found, damaged, diffs,
               began)


def _init_from(config):
    """(config, tokenizer or None) of a fresh run: with `train.init_from`, model.vocab_size=0
    taken from the weights, every tensor's shape checked against the config (the weights are
    read here only to be checked, so that a refused run writes nothing), and the folder's own
    tokenizer if it has one (a fine-tuned GPT-2 keeps GPT-2's vocabulary)."""
    path = config.train.init_from
    if not path:
        return config, None
    if config.model.vocab_size == 0:
        config = config_lib.replace(config, **{"model.vocab_size": hf_load.vocab_size(path)})
    hf_load.init_params(config)
    return config, hf_load.tokenizer(path)


@contextlib.contextmanager
def claim(run: Run):
    """Makes the workdir this run's: writable, locked against a second run, damaged
    checkpoints moved aside (so that this run can save those steps again)."""
    workdir = run.workdir
    processes.barrier("workdir read")  # no process writes before every one has read it
    workdir_lib.check_writable(workdir)  # the first write to the workdir
    with WorkdirLock(workdir):
        _check_unchanged(run)
        for step in run.damaged if jax.process_index() == 0 else ():
            checkpoint.quarantine(workdir, step)
        processes.barrier("damaged checkpoints moved")
        yield


def _check_unchanged(run: Run) -> None:
    """The workdir was read before it was locked: a run that ended in between may have saved.
    Every process looks, and they agree (the worst verdict): one that refused alone left the
    others waiting forever at the next barrier (a shared disk's listing may lag on one host)."""
    folder = checkpoint.directory(run.workdir)
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    newest = run.found.step if run.found else 0
    changed = any(s > newest and s not in run.damaged for s in steps)
    if processes.max_over_processes(int(changed)):
        raise workdir_lib.WorkdirError(f"--workdir={run.workdir}: another run saved a "
                                      "checkpoint there while this one started"
                                      + ("" if changed else " (another process saw it)")
                                      + "; run again")


def initial_state(trainer: Trainer, run: Run) -> tuple[TrainState, int]:
    """(state, steps skipped so far): the checkpoint's, the imported weights' or a fresh one."""
    if run.found is None and run.config.train.init_from:
        return imported_state(trainer), 0
    if run.found is None:
        return trainer.init(run.config.train.seed), 0
    found = run.found
    state = TrainState(found.train["step"], found.params, found.train["opt_state"])
    if jax.tree.structure(state) != jax.tree.structure(trainer.abstract_state()):
        raise ConfigError(f"{run.workdir}: the allowed config change alters the optimizer "
                          "state's layout (train.grad_clip on/off?); use a new --workdir")
    return state, found.meta.get("skipped_steps", 0)


def imported_state(trainer: Trainer) -> TrainState:
    """`train.init_from`'s weights placed with the run's shardings, and a fresh optimizer state
    for them."""
    shardings = trainer.state_sharding
    params = jax.device_put(hf_load.init_params(trainer.config), shardings.params)
    opt_state = jax.jit(trainer.optimizer.init, out_shardings=shardings.opt_state)(params)
    step = jax.device_put(jnp.int32(0), shardings.step)
    return TrainState(step, params, opt_state)

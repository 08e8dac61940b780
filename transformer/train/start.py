"""Where a run starts, in the order it happens:

    config, matmul = resolve_config(config)              validated; model.matmul=auto made concrete
    plan = prepare(config, workdir, mesh, allow_change)  reads only: the checkpoint to continue
                                                         from, the data (and its tokenizer), the
                                                         config's derived values, resume rules
    with claim(plan):                                    the first writes: lock, damaged aside
        state, skipped = initial_state(trainer, plan)    restored, imported (train.init_from) or
                                                         fresh: the one place a state is made

Every check that needs no write fails in `prepare`, so a refused run leaves its workdir as it
was. On several processes every process reads, and they agree on what they found (the step to
restore, which checkpoints are damaged: checkpoint.restore_good) before any of them writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from transformer import checkpoint, data
from transformer import config as config_lib
from transformer.config import ConfigError, depth, resume
from transformer.hf import load as hf_load
from transformer.model import kernels
from transformer.model.kernels import auto
from transformer.parallel import processes, sharding
from transformer.train import workdir as workdir_lib
from transformer.train.trainer import Trainer, TrainState
from transformer.train.workdir import WorkdirLock


def resolve_config(config, platform: str | None = None):
    """(this run's own validated copy of `config` with what model.depth derives filled in,
    `model.matmul=auto` made concrete for `platform` (the mesh's devices; default this host's
    backend) and `train.muon_ns_dtype=auto` after it, the auto.Choice saying why); the
    caller's config is left as it is."""
    # model.depth's sizes, rates, batch and horizon: derived here, once (config/depth.py).
    config = config_lib.validate(depth.derive(config_lib.validate(config)))
    config, choice = auto.resolve(config_lib.replace(config), platform)
    if config.train.muon_ns_dtype == "auto":
        config = config_lib.replace(config, **{"train.muon_ns_dtype":
                                               kernels.compute_dtype(config.model)})
    return config, choice


def check_attention_kernel(config, platform: str) -> None:
    """cuDNN's fused attention exists only in a GPU program (`platform`: the mesh's devices,
    which may be a GPU topology compiled on a CPU host)."""
    if config.model.attention_kernel == "cudnn" and platform not in ("gpu", "cuda"):
        raise ConfigError(f"model.attention_kernel=cudnn: cuDNN flash attention needs an NVIDIA "
                          f"GPU, this run is on {platform}; use attention_kernel=jax")


def resolve(config, tokenizer, mesh=None, saved=None):
    """The config with derived values filled in (a new one; `config` is left as it is): the
    vocabulary size from the tokenizer when it is 0, padded up to a multiple of
    model.vocab_multiple and of the pieces `mesh` splits the vocabulary into (so that
    mesh.tensor=2 needs no hand-padding); a resumed run keeps its checkpoint's (`saved`, the
    config it was saved with), whatever mesh it resumes on. Refuses what this machine cannot
    run."""
    check_attention_kernel(config, jax.default_backend() if mesh is None
                           else sharding.platform(mesh))
    if config.model.vocab_size == 0:
        saved = (saved or {}).get("model", {})
        if saved.get("vocab_size", 0) >= tokenizer.vocab_size:
            return config_lib.replace(config, **{"model.vocab_size": saved["vocab_size"],
                                                 "model.vocab_used": saved.get("vocab_used", 0)})
        multiple = config.model.vocab_multiple
        if mesh is not None:
            multiple = math.lcm(multiple, sharding.shards(mesh, sharding.axis_rules(config),
                                                          "vocab"))
        return config_lib.replace(config, **config_lib.padded_vocab(tokenizer.vocab_size,
                                                                    multiple))
    if config.data.corpus in data.SYNTHETIC:  # synthetic tasks draw below vocab_size: no padding
        return config
    if config.model.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={config.model.vocab_size}: the {tokenizer.kind} "
                          f"tokenizer has {tokenizer.vocab_size} tokens; set at least that, "
                          "or 0 to take it from the tokenizer")
    if config.model.vocab_size > tokenizer.vocab_size and not config.model.vocab_used:
        # Padded by hand: those ids are padding too, never sampled.
        return config_lib.replace(config, **{"model.vocab_used": tokenizer.vocab_size})
    return config


def saved_config(workdir) -> dict | None:
    """The config the newest checkpoint in `workdir` was saved with (derived values as that
    run resolved them), or None: how a caller after training (train.py's sample) resolves
    vocab_size=0 as training did, on whatever mesh the run padded it for."""
    if not checkpoint.directory(workdir).is_dir():
        return None
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    try:
        steps = ckpts.all_steps()
        return ckpts.read_meta(steps[-1])["config"] if steps else None
    finally:
        ckpts.close()


@dataclasses.dataclass
class Plan:
    """What a run found before writing anything."""

    workdir: Path
    config: Any                       # validated, derived values filled in
    tokenizer: Any
    source: Any                       # the batches (data.load)
    found: checkpoint.Restored | None  # the checkpoint to continue from
    damaged: list[int]                # steps to move aside before saving again
    changes: dict = dataclasses.field(default_factory=dict)  # vs the checkpoint's config


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
        _check_fits_checkpoint(ckpts, steps[-1], on_this_mesh, mesh, workdir)
        found = ckpts.restore_good(
            lambda meta: abstract_checkpoint(on_this_mesh(meta["config"]), mesh),
            on_damaged=damaged.append)
    finally:
        ckpts.close()
    return found, damaged


def _check_fits_checkpoint(ckpts, step: int, on_this_mesh, mesh, workdir) -> None:
    """Refuses in one line a mesh that cannot split the model saved at `step` (its sizes are
    the checkpoint's: a vocabulary padded for another mesh, heads): restoring would fail in
    every checkpoint alike, and restore_good would report each as damaged. Processes agree;
    a meta that cannot be read leaves the verdict to restore_good (damage)."""
    error = None
    try:
        config = on_this_mesh(ckpts.read_meta(step)["config"])
    except Exception:  # noqa: BLE001 -- damaged: restore_good says so, and falls back
        config = None
    if config is not None:
        try:
            sharding.check_fits(config, sharding.make_mesh(config.mesh) if mesh is None
                                else mesh, checkpoint=workdir)
        except ConfigError as e:
            error = e
    if processes.max_over_processes(int(error is not None)):
        raise ConfigError(str(error) if error is not None else f"{workdir}: its checkpoint "
                          "does not fit this mesh (another process says why)")


def prepare(config, workdir, mesh, allow_change=()) -> Plan:
    """Reads the workdir and the data and checks everything that needs no write."""
    resume.check_names(allow_change)
    WorkdirLock(workdir).check_free()  # a run in progress there: refused before reading it
    found, damaged = find_checkpoint(workdir, config, mesh)
    if found:  # the run's own tokenizer, saved with it
        tokenizer = data.tokenizers.from_json(found.meta["tokenizer"])
    else:
        config, tokenizer = _init_from(config)  # None: data.tokenizer decides
    tokenizer, source = data.load(config, tokenizer)  # bad data fails before any write
    config = resolve(config, tokenizer, mesh, found.meta["config"] if found else None)
    diffs = {}
    if found:
        diffs = resume.differences(found.meta["config"], config_lib.to_dict(config))
        resume.check(diffs, allow_change, workdir)
        if found.step > config.train.steps:  # nothing to train, and no way to untrain
            raise ConfigError(f"train.steps={config.train.steps} is below the checkpoint's step "
                              f"{found.step} in {workdir}: pass train.steps >= {found.step} "
                              "to continue, or sample.py --step=N for an older checkpoint")
    # Sizes the mesh cannot split: refused here, before claim() writes the workdir.
    sharding.check_fits(config, sharding.make_mesh(config.mesh) if mesh is None else mesh)
    return Plan(Path(workdir), config, tokenizer, source, found, damaged, diffs)


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
def claim(plan: Plan):
    """Makes the workdir this run's: writable, locked against a second run, damaged
    checkpoints moved aside (so that this run can save those steps again)."""
    workdir = plan.workdir
    processes.barrier("workdir read")  # no process writes before every one has read it
    workdir_lib.check_writable(workdir)  # the first write to the workdir
    with WorkdirLock(workdir):
        _check_unchanged(plan)
        for step in plan.damaged if jax.process_index() == 0 else ():
            checkpoint.quarantine(workdir, step)
        processes.barrier("damaged checkpoints moved")
        yield


def _check_unchanged(plan: Plan) -> None:
    """The workdir was read before it was locked: a run that ended in between may have saved.
    Every process looks, and they agree (the worst verdict): one that refused alone left the
    others waiting forever at the next barrier (a shared disk's listing may lag on one host)."""
    folder = checkpoint.directory(plan.workdir)
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    newest = plan.found.step if plan.found else 0
    changed = any(s > newest and s not in plan.damaged for s in steps)
    if processes.max_over_processes(int(changed)):
        raise workdir_lib.WorkdirError(f"--workdir={plan.workdir}: another run saved a "
                                      "checkpoint there while this one started"
                                      + ("" if changed else " (another process saw it)")
                                      + "; run again")


def tokens_trained(found: checkpoint.Restored | None) -> int:
    """Tokens trained through a checkpoint (0 with none): saved with it, as the batch size may
    have changed on a resume; a checkpoint saved before that counts its steps at the batch
    of the config it was saved with."""
    if found is None:
        return 0
    if "tokens" in found.meta:
        return int(found.meta["tokens"])
    saved = found.meta["config"]
    return found.step * saved["train"]["batch_size"] * saved["model"]["max_seq_len"]


def initial_state(trainer: Trainer, plan: Plan) -> tuple[TrainState, int]:
    """(state, steps skipped so far): the checkpoint's, the imported weights' or a fresh one."""
    if plan.found is None and plan.config.train.init_from:
        return imported_state(trainer), 0
    if plan.found is None:
        return trainer.init(plan.config.train.seed), 0
    found = plan.found
    state = TrainState(found.train["step"], found.params, found.train["opt_state"])
    if jax.tree.structure(state) != jax.tree.structure(trainer.abstract_state()):
        raise ConfigError(f"{plan.workdir}: the allowed config change alters the optimizer "
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

"""Training: the optimizer, a jitted train step over explicit state, and the loop around it.

    state  = TrainState(step, params, opt_state)               everything that changes
    state', metrics = train_step(state, batch)                  pure; state buffers donated
    loss   = mean over counted targets of -log softmax(logits)[target]   (float32)

The batch at step s is a pure function of (seed, s) and every save holds params, optimizer
state and step, so a run restarted on its workdir continues where its last checkpoint stood,
bit for bit (docs/README-resume.md; tests/test_resume.py kills runs to check it).

Everything lives on a device mesh (sharding.py): the state is created already split
(eval_shape -> shardings -> jit(init, out_shardings)), the step is compiled with explicit
in/out shardings and donates the old state, and each process builds only the batch rows its
devices hold. One CPU is the 1x1x1 case of the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from transformer import (checkpoint, config as config_lib, data, faults, flops, hf_import,
                         kernels, matmul_auto, resume, sharding, signals, sizes)
from transformer.config import ConfigError, ModelConfig
from transformer import metrics as metrics_lib
from transformer.metrics import MetricsLog, Progress, Throughput
from transformer.model import GPT, count_params, init_params


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


def make_optimizer(t) -> optax.GradientTransformation:
    """AdamW with linear warmup then cosine decay; clipping by global norm; weight decay on
    matrices only (norm scales and biases are not pulled towards zero)."""
    warmup = min(t.warmup_steps, max(t.steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.lr, warmup_steps=warmup,
        decay_steps=max(t.steps, warmup + 1), end_value=t.lr * t.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)  # noqa: E731
    adamw = optax.adamw(schedule, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, mask=decay_mask)
    if t.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw)
    return adamw


def loss_fn(params, batch, model_config: ModelConfig):
    """Weighted mean next-token cross-entropy, in float32."""
    logits_BTV = GPT(model_config).apply({"params": params}, batch["inputs"])
    ce_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, batch["targets"])
    weights_BT = batch["weights"]
    return jnp.sum(ce_BT * weights_BT) / jnp.maximum(jnp.sum(weights_BT), 1.0)


def train_step(state: TrainState, batch, *, model_config, optimizer):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch, model_config)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    # A NaN/inf anywhere in the gradient makes its norm non-finite. Such an update is not
    # applied (params and optimizer state stay as they were); faults.NonFiniteGuard decides
    # on the host whether that stops the run or skips the step.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                     (params, opt_state), (state.params, state.opt_state))
    metrics = {"train_loss": loss, "grad_norm": grad_norm, "nonfinite": ~finite}
    return TrainState(state.step + 1, params, opt_state), metrics


def compute_precision(model_config: ModelConfig) -> str:
    """The dtype the matmuls run in, for choosing the peak that MFU divides by."""
    return kernels.compute_dtype(model_config)


def init_state(model_config: ModelConfig, optimizer, seed: int) -> TrainState:
    params = init_params(model_config, jax.random.key(seed))
    return TrainState(jnp.int32(0), params, optimizer.init(params))


@dataclasses.dataclass
class Trainer:
    """The compiled functions of one run on one mesh (built once from its config)."""

    config: Any
    model_config: ModelConfig
    optimizer: optax.GradientTransformation
    mesh: jax.sharding.Mesh
    rules: tuple
    state_sharding: TrainState
    batch_sharding: jax.sharding.NamedSharding
    step_fn: Callable
    eval_fn: Callable

    @classmethod
    def build(cls, config, mesh=None) -> "Trainer":
        """Compiles for `mesh` (default: the one config.mesh describes over every device).
        Raises ConfigError when the mesh does not fit the devices or cannot split the model."""
        model_config = ModelConfig.from_config(config)
        optimizer = make_optimizer(config.train)
        mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
        sharding.check_fits(config, mesh)
        rules = sharding.axis_rules(config)
        param_sh = sharding.param_shardings(model_config, mesh, rules)
        abstract = jax.eval_shape(lambda: init_state(model_config, optimizer, 0))
        state_sh = TrainState(step=sharding.replicated(mesh), params=param_sh,
                              opt_state=sharding.tree_shardings_like(abstract.opt_state,
                                                                     param_sh, mesh))
        batch_sh = sharding.batch_sharding(mesh, rules)
        replicated = sharding.replicated(mesh)
        step = sharding.constrained(functools.partial(train_step, model_config=model_config,
                                                      optimizer=optimizer), mesh, rules)
        step_fn = jax.jit(step, in_shardings=(state_sh, batch_sh),
                          out_shardings=(state_sh, replicated), donate_argnums=0)
        loss = sharding.constrained(functools.partial(loss_fn, model_config=model_config),
                                    mesh, rules)
        eval_fn = jax.jit(loss, in_shardings=(param_sh, batch_sh), out_shardings=replicated)
        return cls(config, model_config, optimizer, mesh, rules, state_sh, batch_sh,
                   step_fn, eval_fn)

    def init(self, seed: int) -> TrainState:
        """A fresh state, created directly in its shards (never whole on one device).

        Traced without the mesh in scope: the out_shardings alone place every leaf, and
        Flax's DenseGeneral would otherwise pin its flat [D, H*K] kernel with 3-axis names."""
        init = lambda: init_state(self.model_config, self.optimizer, seed)  # noqa: E731
        return jax.jit(init, out_shardings=self.state_sharding)()

    def abstract_state(self) -> TrainState:
        """Shapes, dtypes and this mesh's shardings: the target a checkpoint restores onto."""
        shapes = jax.eval_shape(lambda: init_state(self.model_config, self.optimizer, 0))
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            shapes, self.state_sharding)

    def batch(self, source, seed: int, split: str, index: int) -> dict:
        """Batch `index` as global arrays; this process builds only the rows it holds."""
        B, T = self.config.train.batch_size, self.config.model.max_seq_len
        rows = sharding.process_rows(self.batch_sharding, B, T)
        local = source.batch(seed, split, index, B, rows=rows)
        return sharding.put_batch(local, self.batch_sharding, B)


def evaluate(trainer: Trainer, params, source, seed: int) -> float:
    """Mean validation loss over a fixed set of held-out batches."""
    t = trainer.config.train
    losses = [trainer.eval_fn(params, trainer.batch(source, seed, "val", i))
              for i in range(t.eval_batches)]
    return float(np.mean(jax.device_get(losses)))


def summary(config, params, tokenizer, corpus_desc: str) -> str:
    """`python -m transformer.sizes`'s report for this run, then what it trains on."""
    t = config.train
    model_config = ModelConfig.from_config(config)
    m = config.model
    window = f", window {m.sliding_window}" if m.sliding_window else ""
    lines = [sizes.summary(model_config, batch=t.batch_size, check=False),
             f"variant: {m.position} positions, {m.norm_placement}-{m.norm}, {m.mlp} MLP, "
             f"{model_config.kv_heads} K/V heads, {m.attention_kernel} attention{window}"]
    counted, real = flops.param_counts(model_config)["total"], count_params(params)
    if counted != real:  # flops.py fell behind model.py; tests/test_flops.py should catch it
        lines.append(f"warning: flops.py counts {counted:,} params, the model has {real:,}")
    tokens_per_step = t.batch_size * config.model.max_seq_len
    total_tokens = tokens_per_step * t.steps
    lines.append(f"data: {corpus_desc}, {tokenizer.kind} tokenizer; {tokens_per_step:,} "
                 f"tokens/step, {t.steps:,} steps = {total_tokens:,} tokens, "
                 f"{flops.train_flops_per_token(model_config) * total_tokens:.3g} FLOPs")
    return "\n".join(lines)


def resolve(config, tokenizer):
    """The config with derived values filled in (a new one; `config` is left as it is): the
    vocabulary size from the tokenizer when it is 0."""
    if config.model.vocab_size == 0:
        return config_lib.replace(config, **{"model.vocab_size": tokenizer.vocab_size})
    if (config.model.vocab_size < tokenizer.vocab_size
          and config.data.corpus not in data.SYNTHETIC):  # synthetic tasks draw below vocab_size
        raise ConfigError(f"model.vocab_size={config.model.vocab_size}: the {tokenizer.kind} "
                          f"tokenizer has {tokenizer.vocab_size} tokens; set at least that, "
                          "or 0 to take it from the tokenizer")
    return config


def abstract_checkpoint(config, mesh=None):
    """The abstract (params, train item) of a run with this config on `mesh`: shapes, dtypes
    and shardings, what a restore reads into."""
    abstract = Trainer.build(config, mesh).abstract_state()
    return abstract.params, {"step": abstract.step, "opt_state": abstract.opt_state}


def _all_processes_here(name: str) -> None:
    """A barrier across processes (nothing on one): what each reads must not race a write."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def find_checkpoint(workdir, config, mesh=None):
    """(the newest good checkpoint or None, steps found damaged); reads, never writes.
    Restores onto `mesh` with this config's sharding rules (a run may resume on another mesh)."""
    if not checkpoint.directory(workdir).is_dir():
        return None, []
    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    if not ckpts.all_steps():
        return None, []
    here = config_lib.to_dict(config)["mesh"]
    damaged = []
    found = ckpts.restore_good(
        lambda meta: abstract_checkpoint(config_lib.from_dict({**meta["config"], "mesh": here}),
                                         mesh),
        on_damaged=damaged.append)
    ckpts.close()
    return found, damaged


def train(config, workdir, log: Callable[[str], None] = print, progress: bool = True,
          mesh=None, stop_at: int | None = None, allow_change=()):
    """Trains (or resumes) the run in `workdir` on `mesh` (default: from config.mesh).

    Returns (state, tokenizer). On several processes every process calls this;
    only process 0 logs and writes metrics, and orbax coordinates the checkpoint writes.
    `stop_at` ends this invocation early at that step (with a checkpoint), as an interruption
    would; running again continues the same schedule to `train.steps`.

    Everything that can be checked without writing is checked first (config, corpus,
    checkpoint compatibility, resume.check on a changed config); then the workdir is written.
    Raises signals.Stopped after saving on SIGINT/SIGTERM, faults.NonFiniteError on NaN/inf."""
    # This run's own copy: the caller's config is never changed (hf_import.prepare below
    # still fills model.vocab_size=0 in place, on this copy).
    config, matmul = matmul_auto.resolve(config_lib.replace(config_lib.validate(config)))
    main_process = jax.process_index() == 0
    if not main_process:
        log, progress = (lambda _: None), False
    workdir = Path(workdir)
    mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
    found, damaged = find_checkpoint(workdir, config, mesh)
    saved_tokenizer = (data.tokenizers.from_json(found.meta["tokenizer"]) if found
                       else hf_import.prepare(config))  # checks init_from; None: data.tokenizer
    tokenizer, source = data.load(config, saved_tokenizer)  # bad data fails before any write
    config = resolve(config, tokenizer)
    if found:
        diffs = resume.differences(found.meta["config"], config_lib.to_dict(config))
        resume.check(diffs, allow_change, workdir)

    _all_processes_here("workdir read")  # no process writes before every one has read it
    checkpoint.check_writable(workdir)  # the first write to the workdir
    for step in damaged if main_process else ():
        checkpoint.quarantine(workdir, step)  # so that this run can save those steps again
    _all_processes_here("damaged checkpoints moved")
    ckpts = checkpoint.Checkpoints(workdir, keep=config.train.keep_checkpoints)
    trainer = Trainer.build(config, mesh)
    t = config.train
    metrics_log = MetricsLog(workdir, enabled=main_process)
    if found is None:
        state, skipped = hf_import.fresh_state(trainer, t.seed), 0  # random, or train.init_from
    else:
        state = TrainState(found.train["step"], found.params, found.train["opt_state"])
        if jax.tree.structure(state) != jax.tree.structure(trainer.abstract_state()):
            raise ConfigError(f"{workdir}: the allowed config change alters the optimizer "
                              "state's layout (train.grad_clip on/off?); use a new --workdir")
        skipped = found.meta.get("skipped_steps", 0)
        metrics_log.truncate_after(found.step)  # steps after it are redone and logged again
        log(f"resuming from step {found.step}")
    log(summary(config, state.params, tokenizer, data.corpus.describe(config.data.corpus)))
    log(matmul_auto.describe(matmul))
    log(sharding.describe(trainer.mesh))

    meta = {"config": config_lib.to_dict(config), "tokenizer": tokenizer.to_json(),
            "matmul_reason": matmul.reason}
    start = int(state.step)
    bar = Progress(start, t.steps, enabled=progress)
    tokens_per_step = t.batch_size * config.model.max_seq_len
    flops_per_token = flops.train_flops_per_token(trainer.model_config)
    peak, _ = metrics_lib.peak_flops(compute_precision(trainer.model_config))
    meter, started, tokens_since_log = Throughput(), time.perf_counter(), 0
    end = t.steps if stop_at is None else min(stop_at, t.steps)
    guard = faults.NonFiniteGuard(t.nonfinite, skipped)
    faults.install_save_delay()  # a test hook; nothing unless its variable is set
    pending = None  # (step, metrics) of a logging step, read once the next step is queued
    # This invocation's first line names its kernels (a resumed run may run other ones).
    first_line = {"matmul": matmul.mode, "matmul_reason": matmul.reason}

    def report(done, metrics):
        nonlocal tokens_since_log
        metrics = jax.device_get(metrics)  # the only host sync of a logging interval
        tokens_per_s = meter.tick(tokens_since_log)
        tokens_since_log = 0
        loss = float(metrics["train_loss"])
        mfu = metrics_lib.mfu(tokens_per_s, flops_per_token, peak, jax.device_count())
        metrics_log.write(step=done, tokens=done * tokens_per_step, train_loss=loss,
                          grad_norm=metrics["grad_norm"], tokens_per_s=tokens_per_s, mfu=mfu,
                          skipped_steps=guard.skipped, **first_line)
        first_line.clear()
        bar.set_postfix(loss=loss, tok_s=round(tokens_per_s), mfu=f"{mfu:.1%}")

    try:
        with signals.GracefulStop() as stop:
            for step in range(start, end):
                done = step + 1
                batch = faults.poison(trainer.batch(source, t.seed, "train", step), done)
                state, metrics = trainer.step_fn(state, batch)
                if pending is not None:  # one step late: the device never waits for the host
                    report(*pending)
                    pending = None
                guard.push(done, metrics["nonfinite"])
                faults.step_delay()
                tokens_since_log += tokens_per_step
                if done % t.log_every == 0 or done == t.steps:
                    pending = (done, metrics)
                bar.update(1)
                syncing = (done % t.eval_every == 0 or done % t.ckpt_every == 0 or done == end
                           or stop.requested)
                if pending is not None and syncing:
                    report(*pending)  # about to sync anyway
                    pending = None
                if done % t.eval_every == 0 or done == t.steps:
                    with meter.paused():  # evaluation time is not training throughput
                        val_loss = evaluate(trainer, state.params, source, t.seed)
                    metrics_log.write(step=done, tokens=done * tokens_per_step,
                                      val_loss=val_loss)
                    bar.write(f"step {done}: val_loss {val_loss:.4f}")
                if done % t.ckpt_every == 0 or done == end or stop.requested:
                    guard.flush()  # never save a state that followed an unchecked step
                    with meter.paused():
                        ckpts.save(done, state.params,
                                   {"step": state.step, "opt_state": state.opt_state},
                                   {**meta, "step": done, "skipped_steps": guard.skipped})
                if stop.requested:
                    ckpts.wait()
                    raise signals.Stopped(stop.requested, done)
            guard.flush()
    finally:
        bar.close()
        ckpts.wait()  # a save in flight is committed even when the run stops with an error
        ckpts.close()
    if start < end:
        log(f"trained steps {start}..{end} in {time.perf_counter() - started:.1f}s")
    return state, tokenizer

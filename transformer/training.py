"""Training: the optimizer, a jitted train step over explicit state, and the loop around it.

    state  = TrainState(step, params, opt_state)               everything that changes
    state', metrics = train_step(state, batch)                  pure; state buffers donated
    loss   = mean over counted targets of -log softmax(logits)[target]   (float32)

The batch at step s is a pure function of (seed, s) and every save holds params, optimizer
state and step, so a run restarted on its workdir continues where its last checkpoint stood.
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

from transformer import checkpoint, config as config_lib, data, generate
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
    metrics = {"train_loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(state.step + 1, params, opt_state), metrics


def compute_precision(model_config: ModelConfig) -> str:
    """The dtype the matmuls run in, for choosing the peak that MFU divides by."""
    if model_config.matmul == "fast_bf16" or model_config.dtype == "bfloat16":
        return "bfloat16"
    return "float32"


def init_state(model_config: ModelConfig, optimizer, seed: int) -> TrainState:
    params = init_params(model_config, jax.random.key(seed))
    return TrainState(jnp.int32(0), params, optimizer.init(params))


@dataclasses.dataclass
class Trainer:
    """The compiled functions of one run (built once from its config)."""

    config: Any
    model_config: ModelConfig
    optimizer: optax.GradientTransformation
    step_fn: Callable
    eval_fn: Callable

    @classmethod
    def build(cls, config) -> "Trainer":
        model_config = ModelConfig.from_config(config)
        optimizer = make_optimizer(config.train)
        step_fn = jax.jit(functools.partial(train_step, model_config=model_config,
                                            optimizer=optimizer), donate_argnums=0)
        eval_fn = jax.jit(functools.partial(loss_fn, model_config=model_config))
        return cls(config, model_config, optimizer, step_fn, eval_fn)

    def abstract_state(self) -> TrainState:
        return jax.eval_shape(lambda: init_state(self.model_config, self.optimizer, 0))


def evaluate(trainer: Trainer, params, source, seed: int) -> float:
    """Mean validation loss over a fixed set of held-out batches."""
    t = trainer.config.train
    losses = [trainer.eval_fn(params, source.batch(seed, "val", i, t.batch_size))
              for i in range(t.eval_batches)]
    return float(np.mean(jax.device_get(losses)))


def summary(config, params, tokenizer, corpus_desc: str) -> str:
    m, t = config.model, config.train
    n_total = count_params(params)
    n_embed = params["embed"]["embedding"].size + params["pos_embed"].size
    tokens_per_step = t.batch_size * m.max_seq_len
    return (f"model: {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, d_ff {m.d_ff}, "
            f"context {m.max_seq_len}, vocab {m.vocab_size}\n"
            f"params: {n_total:,} total, {n_total - n_embed:,} non-embedding\n"
            f"data: {corpus_desc}, {tokenizer.kind} tokenizer; {tokens_per_step:,} tokens/step, "
            f"{t.steps:,} steps = {tokens_per_step * t.steps:,} tokens")


def resolve(config, tokenizer) -> None:
    """Fills derived values: the vocabulary size from the tokenizer when it is 0."""
    if config.model.vocab_size == 0:
        config.model.vocab_size = tokenizer.vocab_size
    elif (config.model.vocab_size < tokenizer.vocab_size
          and config.data.corpus not in data.SYNTHETIC):  # synthetic tasks draw below vocab_size
        raise ConfigError(f"model.vocab_size={config.model.vocab_size}: the {tokenizer.kind} "
                          f"tokenizer has {tokenizer.vocab_size} tokens; set at least that, "
                          "or 0 to take it from the tokenizer")


def _check_same_model(config, saved: dict, workdir) -> None:
    saved_model = saved["model"]
    diffs = [f"model.{k}: {saved_model[k]!r} -> {v!r}" for k, v in config.model.items()
             if k in saved_model and saved_model[k] != v and k != "vocab_size"]
    if diffs:
        raise ConfigError(f"{workdir} holds a checkpoint of another model ({'; '.join(diffs)}): "
                          "use a new --workdir or the saved config")


def train(config, workdir, log: Callable[[str], None] = print, progress: bool = True,
          stop_at: int | None = None):
    """Trains (or resumes) the run in `workdir`. Returns (state, tokenizer).

    `stop_at` ends this invocation early at that step (with a checkpoint), as an interruption
    would; running again continues the same schedule to `train.steps`."""
    config_lib.validate(config)
    workdir = Path(workdir)
    latest, saved_tokenizer = None, None
    if checkpoint.directory(workdir).is_dir():
        latest = checkpoint.Checkpoints(workdir, read_only=True).latest_step()
    if latest is not None:
        meta = checkpoint.Checkpoints(workdir, read_only=True).read_meta(latest)
        _check_same_model(config, meta["config"], workdir)
        saved_tokenizer = data.tokenizers.from_json(meta["tokenizer"])
    tokenizer, source = data.load(config, saved_tokenizer)  # bad data fails before any write
    resolve(config, tokenizer)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpts = checkpoint.Checkpoints(workdir, keep=config.train.keep_checkpoints)

    trainer = Trainer.build(config)
    t = config.train
    if latest is None:
        state = init_state(trainer.model_config, trainer.optimizer, t.seed)
    else:
        abstract = trainer.abstract_state()
        params, rest = ckpts.restore(latest, abstract.params,
                                     {"step": abstract.step, "opt_state": abstract.opt_state})
        state = TrainState(rest["step"], params, rest["opt_state"])
        log(f"resuming from step {latest}")
    log(summary(config, state.params, tokenizer, data.corpus.describe(config.data.corpus)))

    meta = {"config": config_lib.to_dict(config), "tokenizer": tokenizer.to_json()}
    metrics_log = MetricsLog(workdir)
    start = int(state.step)
    bar = Progress(start, t.steps, enabled=progress)
    tokens_per_step = t.batch_size * config.model.max_seq_len
    flops_per_token = metrics_lib.model_flops_per_token(trainer.model_config)
    peak, _ = metrics_lib.peak_flops(compute_precision(trainer.model_config))
    meter, started, tokens_since_log = Throughput(), time.perf_counter(), 0
    end = t.steps if stop_at is None else min(stop_at, t.steps)
    pending = None  # (step, metrics) of a logging step, read once the next step is queued

    def report(done, metrics):
        nonlocal tokens_since_log
        metrics = jax.device_get(metrics)  # the only host sync of a logging interval
        tokens_per_s = meter.tick(tokens_since_log)
        tokens_since_log = 0
        loss = float(metrics["train_loss"])
        mfu = metrics_lib.mfu(tokens_per_s, flops_per_token, peak, jax.device_count())
        metrics_log.write(step=done, train_loss=loss, grad_norm=metrics["grad_norm"],
                          tokens_per_s=tokens_per_s, mfu=mfu)
        bar.set_postfix(loss=loss, tok_s=round(tokens_per_s), mfu=f"{mfu:.1%}")

    for step in range(start, end):
        state, metrics = trainer.step_fn(state, source.batch(t.seed, "train", step, t.batch_size))
        done = step + 1
        if pending is not None:  # metrics one step late: the device never waits for the host
            report(*pending)
            pending = None
        tokens_since_log += tokens_per_step
        if done % t.log_every == 0 or done == t.steps:
            pending = (done, metrics)
        bar.update(1)
        if pending is not None and (done % t.eval_every == 0 or done % t.ckpt_every == 0
                                    or done == end):
            report(*pending)  # about to sync anyway
            pending = None
        if done % t.eval_every == 0 or done == t.steps:
            with meter.paused():  # evaluation time is not training throughput
                val_loss = evaluate(trainer, state.params, source, t.seed)
            metrics_log.write(step=done, val_loss=val_loss)
            bar.write(f"step {done}: val_loss {val_loss:.4f}")
        if done % t.ckpt_every == 0 or done == end:
            with meter.paused():
                ckpts.save(done, state.params, {"step": state.step, "opt_state": state.opt_state},
                           {**meta, "step": done})
    bar.close()
    ckpts.wait()
    ckpts.close()
    if start < end:
        log(f"trained steps {start}..{end} in {time.perf_counter() - started:.1f}s")
    return state, tokenizer

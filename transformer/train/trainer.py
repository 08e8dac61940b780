"""The compiled functions of one run on one mesh: the train step, evaluation, batches.

    trainer = Trainer.build(config, mesh)        compiles step.train_step for the mesh
    state', metrics = trainer.step_fn(state, batch)        state buffers donated
    val_loss = evaluate(trainer, params, source, seed)          eval_batches of the seed's order
    val_loss = evaluate_final(trainer, params, source, seed)    train.eval_tokens, fixed windows

The loop around the step, checkpoints and resuming live in run.py (start.py, loop.py).

Everything lives on a device mesh (sharding.py): the state is created already split
(eval_shape -> shardings -> jit(init, out_shardings)), the step is compiled with explicit
in/out shardings and donates the old state, and each process builds only the batch rows its
devices hold. One CPU is the 1x1x1 case of the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import numpy as np
import optax

from transformer import checkpoint
from transformer.config import ModelConfig
from transformer.model import kernels
from transformer.parallel import sharding
from transformer.train import scratch
from transformer.train.optimizer import make_optimizer
from transformer.train.step import TrainState, init_state, loss_fn, train_step


def compute_precision(model_config: ModelConfig) -> str:
    """The dtype the matmuls run in, for choosing the peak that MFU divides by."""
    return kernels.compute_dtype(model_config)


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
    abstract: TrainState              # layout(): shapes, dtypes and shardings of the state

    @classmethod
    def build(cls, config, mesh=None) -> "Trainer":
        """Compiles for `mesh` (default: the one config.mesh describes over every device; a
        run hands its own, made once at its start). Checks no sizes: a run's start checks
        that the mesh splits the model (start.prepare, before anything is written), and a
        size the mesh cannot split fails here in XLA's words."""
        model_config = ModelConfig.from_config(config)
        optimizer = make_optimizer(config.train, config.model.d_model)
        mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
        rules = sharding.axis_rules(config)
        abstract = layout(model_config, optimizer, mesh, rules)
        state_sh = jax.tree.map(lambda a: a.sharding, abstract)
        param_sh = state_sh.params
        batch_sh = sharding.batch_sharding(mesh, rules)
        replicated = sharding.replicated(mesh)
        step = sharding.constrained(functools.partial(train_step, model_config=model_config,
                                                      optimizer=optimizer,
                                                      micro_batches=config.train.grad_accum,
                                                      z_loss=config.train.z_loss,
                                                      platform=sharding.platform(mesh)),
                                    mesh, rules)
        # On CPU, the step's scratch in blocks glibc keeps between steps (scratch.py).
        options = scratch.compiler_options(
            sharding.platform(mesh),
            scratch.largest_activation_bytes(model_config,
                                             config.train.batch_size // config.train.grad_accum))
        step_fn = jax.jit(step, in_shardings=(state_sh, batch_sh),
                          out_shardings=(state_sh, replicated), donate_argnums=0,
                          compiler_options=options)
        loss = sharding.constrained(functools.partial(loss_fn, model_config=model_config),
                                    mesh, rules)
        eval_fn = jax.jit(loss, in_shardings=(param_sh, batch_sh), out_shardings=replicated,
                          compiler_options=options)
        return cls(config, model_config, optimizer, mesh, rules, state_sh, batch_sh,
                   step_fn, eval_fn, abstract)

    def init(self, seed: int) -> TrainState:
        """A fresh state, created directly in its shards (never whole on one device).

        Traced without the mesh in scope: the out_shardings alone place every leaf, and
        Flax's DenseGeneral would otherwise pin its flat [D, H*K] kernel with 3-axis names."""
        init = lambda: init_state(self.model_config, self.optimizer, seed)  # noqa: E731
        return jax.jit(init, out_shardings=self.state_sharding)()

    def abstract_state(self) -> TrainState:
        """Shapes, dtypes and this mesh's shardings: the target a checkpoint restores onto."""
        return self.abstract

    def precompile(self, batch: dict, which=("step", "eval", "save")) -> None:
        """Compiles the step, evaluation and a checkpoint save's fingerprints (`which`) now for
        the state and for batches shaped like `batch` (a local batch, as `source.batch` gives),
        so that their first calls find them compiled: lowered with the shardings both were built with, they are the programs
        those calls lower, and jit's cache hands them over. Meant for a thread beside start-up
        work (run.py): XLA compiles without holding Python's lock, on the core start-up leaves
        idle."""
        B = self.config.train.batch_size
        spec = {k: jax.ShapeDtypeStruct((B,) + np.shape(v)[1:], np.asarray(v).dtype,
                                        sharding=self.batch_sharding) for k, v in batch.items()}
        state = self.abstract_state()
        if "step" in which:
            self.step_fn.lower(state, spec).compile()
        if "eval" in which:
            self.eval_fn.lower(state.params, spec).compile()
        if "save" in which:  # the fingerprints a checkpoint save computes (loop.py's trees)
            checkpoint.precompile_fingerprint(state.params)
            checkpoint.precompile_fingerprint({"step": state.step, "opt_state": state.opt_state})

    def batch(self, source, seed: int, split: str, index: int) -> dict:
        """Batch `index` as global arrays; this process builds only the rows it holds."""
        B, T = self.config.train.batch_size, self.config.model.max_seq_len
        rows = sharding.process_rows(self.batch_sharding, B, T)
        return sharding.put_batch(source.batch(seed, split, index, B, rows=rows),
                                  self.batch_sharding, B)

    def windows_batch(self, source, windows: np.ndarray, index: int) -> dict:
        """Batch `index` of the validation windows `windows` (row r is windows[index·B + r]);
        rows past their end (the last, partial batch) repeat the last window and count
        nothing (weight 0). This process builds only the rows it holds."""
        B, T = self.config.train.batch_size, self.config.model.max_seq_len
        at = index * B + np.asarray(sharding.process_rows(self.batch_sharding, B, T), np.int64)
        local = source.read_windows("val", windows[np.minimum(at, len(windows) - 1)])
        local["weights"] = np.where((at >= len(windows))[:, None], 0.0,
                                    local["weights"]).astype(np.float32)
        return sharding.put_batch(local, self.batch_sharding, B)


def layout(model_config: ModelConfig, optimizer, mesh: jax.sharding.Mesh, rules) -> TrainState:
    """The state's shapes, dtypes and shardings on `mesh` (jax.ShapeDtypeStruct leaves), from
    jax.eval_shape: nothing is allocated or compiled. What Trainer.build places the state in
    and what a checkpoint restores into (start.abstract_checkpoint)."""
    param_sh = sharding.param_shardings(model_config, mesh, rules)
    shapes = jax.eval_shape(lambda: init_state(model_config, optimizer, 0))
    shardings = TrainState(step=sharding.replicated(mesh), params=param_sh,
                           opt_state=sharding.tree_shardings_like(shapes.opt_state, param_sh,
                                                                  mesh))
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        shapes, shardings)


def bits_per_byte(loss_nats: float, tokens_per_byte: float) -> float:
    """Nats per token → bits per byte of text: comparable across tokenizers."""
    return loss_nats / math.log(2) * tokens_per_byte


def evaluate(trainer: Trainer, params, source, seed: int, batches: int | None = None) -> float:
    """Mean validation loss (nats per token) over `batches` held-out batches (default
    `train.eval_batches`) of the seed's order: the evaluations during training."""
    batches = trainer.config.train.eval_batches if batches is None else batches
    losses = [trainer.eval_fn(params, trainer.batch(source, seed, "val", i))
              for i in range(batches)]
    return float(np.mean(jax.device_get(losses)))


def evaluate_final(trainer: Trainer, params, source, seed: int,
                   tokens: int | None = None) -> float:
    """The run's last validation loss (nats per token): the windows `source.eval_windows`
    picks for `tokens` validation tokens (default `train.eval_tokens`; 0: every window once),
    the same whatever the seed, weighted by tokens. A source without a fixed validation split
    (the synthetic tasks) scores `train.eval_batches` batches of the seed's instead."""
    t = trainer.config.train
    if not hasattr(source, "eval_windows"):
        return evaluate(trainer, params, source, seed)
    windows = source.eval_windows(t.eval_tokens if tokens is None else tokens)
    n, B = len(windows), t.batch_size
    count = math.ceil(n / B)
    losses = [trainer.eval_fn(params, trainer.windows_batch(source, windows, i))
              for i in range(count)]
    rows = np.minimum(B, n - B * np.arange(count))  # every row holds the same T tokens
    return float(np.sum(np.asarray(jax.device_get(losses), np.float64) * rows) / n)

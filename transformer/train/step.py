"""One training step over explicit state, and the loss it descends.

    state  = TrainState(step, params, opt_state)               everything that changes
    state', metrics = train_step(state, batch)                  pure; the caller donates state
    loss   = mean over counted targets of -log softmax(logits)[target]   (float32)
    descended = loss + z · mean of logsumexp(logits)²              train.z_loss = z (0: off)

Nothing here knows about devices: trainer.py compiles `train_step` for a mesh, and tells it
the mesh's platform (a TPU program built on a CPU host is a TPU program).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from transformer.config import ModelConfig
from transformer.model.gpt import GPT, init_params


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


def loss_fn(params, batch, model_config: ModelConfig):
    """Weighted mean next-token cross-entropy, in float32."""
    return objective(params, batch, model_config)[1]


def objective(params, batch, model_config: ModelConfig, z_loss: float = 0.0):
    """(what the step descends, the cross-entropy it logs), both weighted means in float32.

    The z-loss (PaLM, Chowdhery et al. 2022, §5) adds z · log²Z with Z = Σ_v exp(logit_v), the
    softmax's normaliser: it leaves the probabilities free but pulls log Z towards 0, so the
    logits cannot drift upwards together (a shift the cross-entropy does not see) until float
    rounding of the softmax hurts. Padding ids (logit -inf) add nothing to Z."""
    logits_BTV = GPT(model_config).apply({"params": params}, batch["inputs"])
    ce_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, batch["targets"])
    weights_BT = batch["weights"]
    count = jnp.maximum(jnp.sum(weights_BT), 1.0)
    ce = jnp.sum(ce_BT * weights_BT) / count
    if not z_loss:
        return ce, ce
    log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    return ce + z_loss * jnp.sum(jnp.square(log_z_BT) * weights_BT) / count, ce


def accumulated_grad(params, batch, model_config, micro_batches: int, z_loss: float = 0.0):
    """(loss, gradient) of the whole batch, computed `micro_batches` rows-slices at a time.

    Each micro-batch's mean is weighted by its counted targets, so the result is the mean
    over every counted target of the batch: one batch of k·b up to float rounding. Micro-batch
    i takes rows i, i+k, i+2k, ...: with the batch split over devices by rows, every
    micro-batch stays split the same way. The loss returned is the cross-entropy; the gradient
    is that of the objective (with the z-loss when z_loss > 0)."""
    def grad_fn(params, batch, model_config):
        (_, ce), grads = jax.value_and_grad(objective, has_aux=True)(params, batch,
                                                                     model_config, z_loss)
        return ce, grads

    if micro_batches == 1:
        return grad_fn(params, batch, model_config)
    k = micro_batches
    micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
                         batch)

    def add(carry, mb):
        loss_sum, grad_sum, count = carry
        n = jnp.sum(mb["weights"])
        loss, grads = grad_fn(params, mb, model_config)
        grad_sum = jax.tree.map(lambda s, g: s + n * g, grad_sum, grads)
        return (loss_sum + n * loss, grad_sum, count + n), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss_sum, grad_sum, count), _ = jax.lax.scan(add, (jnp.float32(0), zeros, jnp.float32(0)),
                                                  micro)
    count = jnp.maximum(count, 1.0)
    return loss_sum / count, jax.tree.map(lambda g: g / count, grad_sum)


def schedule_at(opt_state, step):
    """`opt_state` with the learning-rate schedule's count set to `step`.

    The schedule is a function of the step, as the batch is: a skipped (non-finite) step
    reverts the optimizer state, its schedule count too, while the step advances; without
    this the schedule would lag one update behind per skip and the run would end above
    lr·min_lr_ratio. Adam's own count (bias correction) stays with the moments it counts."""
    def at(s):
        if isinstance(s, optax.ScaleByScheduleState):
            return s._replace(count=jnp.asarray(step, s.count.dtype))
        return s
    return jax.tree.map(at, opt_state,
                        is_leaf=lambda s: isinstance(s, optax.ScaleByScheduleState))


def train_step(state: TrainState, batch, *, model_config, optimizer, micro_batches: int = 1,
               z_loss: float = 0.0, platform: str | None = None):
    """`platform`: what the program is built for (the mesh's devices: trainer.py binds it),
    which decides how a non-finite step is skipped; None: the default backend, where a step
    jitted without a mesh runs."""
    platform = jax.default_backend() if platform is None else platform
    loss, grads = accumulated_grad(state.params, batch, model_config, micro_batches, z_loss)
    grad_norm = optax.tree.norm(grads)
    # A NaN/inf anywhere in the gradient makes its norm non-finite. Such an update is not
    # applied (params and optimizer state stay as they were); faults.NonFiniteGuard decides
    # on the host whether that stops the run or skips the step.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def update(params, opt_state):
        updates, opt_state = optimizer.update(grads, schedule_at(opt_state, state.step), params)
        return optax.apply_updates(params, updates), opt_state

    if platform == "cpu":
        # A branch, not a select: XLA-CPU computed each moment's update in two fusions that
        # both read the old moment, one writing it in place, so it copied every moment first
        # (~30 MB a step at the bench's shape; the step 0.93x without them, docs/performance.md).
        params, opt_state = jax.lax.cond(finite, update, lambda p, o: (p, o),
                                         state.params, state.opt_state)
    else:  # GPU/TPU: a select fuses into the update (a device branch would wait on the host)
        params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                         update(state.params, state.opt_state),
                                         (state.params, state.opt_state))
    metrics = {"train_loss": loss, "grad_norm": grad_norm, "nonfinite": ~finite}
    return TrainState(state.step + 1, params, opt_state), metrics


def init_state(model_config: ModelConfig, optimizer, seed: int) -> TrainState:
    params = init_params(model_config, jax.random.key(seed))
    return TrainState(jnp.int32(0), params, optimizer.init(params))

"""The optimizer: AdamW, which parameters it decays, and the learning-rate schedule.

    optimizer = make_optimizer(config.train, d_model)  # an optax.GradientTransformation
    decay_mask(params)                            # {path: True where weight decay applies}
    learning_rate(config.train)(step)             # the schedule, a function of the step

Weight decay by the parameter's role, read from its name, never from its shape:
    decayed      kernels (every dense projection), the token embedding, the learned position
                 table: the matrices that map between spaces
    not decayed  norm scales and biases, projection biases: pulling a norm's gain or a bias
                 towards zero is a constraint on the function, not on its complexity
A shape rule (`ndim >= 2`) gets this wrong twice: the per-head query/key/value biases are
[H, K], and with `model.scan_layers=True` every block parameter carries a leading layer
axis, so all norm scales and biases become 2-D and would be decayed.

Schedules (`train.schedule`), each after a linear warmup over `train.warmup_steps` updates
(lr/warmup_steps, 2·lr/warmup_steps, ..., lr: no update is wasted at lr = 0):
    cosine    cosine from lr down to exactly lr·min_lr_ratio at the last update
    wsd       warmup-stable-decay: lr held until the last `train.decay_fraction` of the steps,
              then down to exactly lr·min_lr_ratio (at the last update) along
              `train.decay_shape`:
              linear 1-p, cosine (1+cos πp)/2, sqrt 1-√p (p: progress through the decay)
    constant  lr after warmup, no decay
`train.lr_base_width = w` (0: off) trains the blocks' hidden matrices at lr·w/d_model and
the rest at lr: μP's width rule for AdamW, so an lr tuned at width w transfers (width_lr.py).

WSD lets one run be cut anywhere and cooled down (Hägele et al. 2024), which is what makes
its loss at several budgets comparable to separately scheduled cosine runs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from transformer.config.fields import DECAY_SHAPES, SCHEDULES  # noqa: F401 - the choices live there
from transformer.train import width_lr

DECAYED = ("kernel", "embedding", "pos_embed")
NOT_DECAYED = ("scale", "bias")


def decays(path) -> bool:
    """Whether the parameter at this pytree path gets weight decay (by its leaf name)."""
    name = str(getattr(path[-1], "key", path[-1]))
    if name in DECAYED:
        return True
    if name in NOT_DECAYED:
        return False
    raise ValueError(f"parameter {jax.tree_util.keystr(path)}: no weight-decay role for a "
                     f"leaf named {name!r}; add it to optimizer.DECAYED or NOT_DECAYED")


def decay_mask(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: decays(path), params)


def _decay_factor(shape: str, p):
    """1 at the start of the decay, 0 at its end."""
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + jnp.cos(math.pi * p))
    return 1.0 - jnp.sqrt(p)


def learning_rate(t):
    """The schedule `train` describes, as a function of the update count: 0 is the first of
    `train.steps` updates, steps - 1 the last.

    Both ends are updates that count: the first gets lr/warmup_steps (never 0, which would
    waste a step), the warmup reaches lr at update warmup_steps - 1, and the last update gets
    exactly lr·min_lr_ratio (cosine and WSD). The decay runs over progress
    p = (count - start) / (steps - 1 - start), from p = 0 at `start` (an update at the peak)
    to p = 1 at the last update."""
    peak, end = t.lr, t.lr * t.min_lr_ratio
    warmup = min(t.warmup_steps, max(t.steps - 1, 0))
    start = max(warmup - 1, 0)  # the last update at the peak before the decay
    if t.schedule == "wsd":
        decay_steps = max(1, round(t.decay_fraction * t.steps))
        start, shape = max(start, t.steps - 1 - decay_steps), t.decay_shape
    else:
        shape = "cosine"
    span = max(t.steps - 1 - start, 1)

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warm = peak * (step + 1) / max(warmup, 1)
        p = jnp.clip((step - start) / span, 0.0, 1.0)
        after = (jnp.full_like(step, peak) if t.schedule == "constant"
                 else end + (peak - end) * _decay_factor(shape, p))
        return jnp.where(step < warmup, warm, after)

    return schedule


def make_optimizer(t, d_model: int = 0) -> optax.GradientTransformation:
    """AdamW with `learning_rate(t)`, weight decay by role, clipping by global norm; with
    `train.lr_base_width` its hidden matrices at lr·lr_base_width/d_model (width_lr.py)."""
    adamw = optax.adamw(learning_rate(t), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay,
                        mask=decay_mask)
    if t.lr_base_width:
        if d_model <= 0:
            raise ValueError("train.lr_base_width needs the model's d_model")
        adamw = width_lr.scale_hidden_matrices(adamw, width_lr.multiplier(t, d_model))
    if t.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw)
    return adamw

"""The optimizer: AdamW or Muon, which parameters get which, what is decayed, and the
learning-rate schedule.

    optimizer = make_optimizer(config.train, d_model)  # an optax.GradientTransformation
    decay_mask(params)                            # {path: True where weight decay applies}
    muon_dimensions(params)                       # {path: how Muon sees it as a matrix | None}
    learning_rate(config.train)(step)             # the schedule, a function of the step

`train.optimizer`:
    adamw     AdamW at `train.lr` for every parameter
    muon      Muon (optax.contrib.scale_by_muon's math, batched over same-shaped matrices by
              muon.py: Nesterov momentum `train.muon_momentum`, then `train.muon_ns_steps`
              Newton-Schulz steps that orthogonalise it) at `train.muon_lr` for the hidden
              matrices of the blocks (attention's query/key/value/out, the MLP's kernels);
              AdamW at `train.lr` (with the same betas, decay and masks as above) for
              everything else: the token embedding, the position table, the untied head, norm
              scales and biases. Both groups follow the same schedule shape, each from its
              own peak. As in Keller Jordan's Muon, an orthogonalised update is scaled by
              sqrt(max(1, fan_out / fan_in)), and Muon's matrices are decayed by
              `train.muon_weight_decay` (decoupled, times the Muon lr).

Muon orthogonalises a matrix, and attention's kernels are per-head 3-D arrays. The rule
(`muon_dimensions`) takes the matrix each kernel applies to the residual stream:
    query / key / value  [D, H, K]  ->  D x (H·K)    (fan in D, fan out H·K)
    out                  [H, K, D]  ->  (H·K) x D    (fan in H·K, fan out D)
    mlp kernels          [D, F], [F, D]  as they are
so a per-head kernel gets exactly the update Muon gives its 2-D reshape (one matrix for all
heads, not one per head). Axes are counted from the end, so with `model.scan_layers=True`
the leading layer axis of a stacked [L, ...] kernel is a batch axis: each layer's matrix is
orthogonalised on its own, as in the unrolled stack.

Weight decay by the parameter's role, read from its name, never from its shape:
    decayed      kernels (every dense projection), the token embedding, the learned position
                 table: the matrices that map between spaces
    not decayed  norm scales and biases, projection biases: pulling a norm's gain or a bias
                 towards zero is a constraint on the function, not on its complexity
A shape rule (`ndim >= 2`) gets this wrong twice: the per-head query/key/value biases are
[H, K], and with `model.scan_layers=True` every block parameter carries a leading layer
axis, so all norm scales and biases become 2-D and would be decayed.

Schedules (`train.schedule`), each after a linear warmup over `train.warmup_steps` updates
(lr/warmup_steps, 2·lr/warmup_steps, ..., lr: no update is wasted at lr = 0; a warmup as
long as the run or longer is squeezed into its first steps - 1 updates, so that the last
one is still the schedule's end, lr·min_lr_ratio under cosine and WSD):
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
from optax.contrib import MuonDimensionNumbers

from transformer.config.fields import DECAY_SHAPES, SCHEDULES  # noqa: F401 - the choices live there
from transformer.train import muon, width_lr

DECAYED = ("kernel", "embedding", "pos_embed")
# gain: a learned scalar (the smear's, backout's); gate: the smear's and value embeddings'
# gate weights (nanochat decays neither).
NOT_DECAYED = ("scale", "bias", "gain", "gate")


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


# Muon's view of each hidden matrix, by module name, with axes counted from the end.
_QKV = MuonDimensionNumbers(reduction_axis=(-3,), output_axis=(-2, -1))
_OUT = MuonDimensionNumbers(reduction_axis=(-3, -2), output_axis=(-1,))
_DENSE = MuonDimensionNumbers(reduction_axis=(-2,), output_axis=(-1,))
_MUON_MATRICES = {"attn": {"query": _QKV, "key": _QKV, "value": _QKV, "out": _OUT},
                  "mlp": {"expand": _DENSE, "gate": _DENSE, "project": _DENSE}}


def muon_dims(path):
    """How Muon sees the parameter at this path as a matrix, or None where AdamW trains it:
    a `kernel` of a block's attention or MLP (by its names, never its shape: the head's
    kernel is 2-D too, and stays with AdamW)."""
    keys = [str(getattr(k, "key", k)) for k in path]
    if len(keys) < 3 or keys[-1] != "kernel":
        return None
    return _MUON_MATRICES.get(keys[-3], {}).get(keys[-2])


def muon_dimensions(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: muon_dims(path), params)


def _fans(x, dims: MuonDimensionNumbers):
    fan_in = math.prod(x.shape[a] for a in dims.reduction_axis)
    return fan_in, math.prod(x.shape[a] for a in dims.output_axis)


def _scale_by_width(dims_fn) -> optax.GradientTransformation:
    """Orthogonalised updates times sqrt(max(1, fan_out / fan_in)) (Jordan's Muon)."""

    def update(updates, state, params=None):
        del params
        dims = dims_fn(updates)
        scaled = jax.tree.map(
            lambda u, d: u * math.sqrt(max(1.0, _fans(u, d)[1] / _fans(u, d)[0])),
            updates, dims, is_leaf=lambda x: isinstance(x, MuonDimensionNumbers))
        return scaled, state

    return optax.GradientTransformation(optax.init_empty_state, update)


def learning_rate(t, peak=None):
    """The schedule `train` describes, as a function of the update count: 0 is the first of
    `train.steps` updates, steps - 1 the last.

    Both ends are updates that count: the first gets lr/warmup_steps (never 0, which would
    waste a step), the warmup reaches lr at update warmup_steps - 1, and the last update gets
    exactly lr·min_lr_ratio (cosine and WSD). The decay runs over progress
    p = (count - start) / (steps - 1 - start), from p = 0 at `start` (an update at the peak)
    to p = 1 at the last update. `peak` (default `t.lr`) gives the same shape from another
    peak: Muon's `t.muon_lr`."""
    peak = t.lr if peak is None else peak
    end = peak * t.min_lr_ratio
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


def _muon(t) -> optax.GradientTransformation:
    """Muon for the matrices `muon_dims` names (the tree it receives holds only those)."""
    def dims(updates):  # the partitioned tree: MaskedNode (an empty node) where AdamW trains
        return jax.tree_util.tree_map_with_path(lambda path, _: muon_dims(path), updates)

    steps = [muon.scale_by_muon(beta=t.muon_momentum, ns_steps=t.muon_ns_steps, dims_fn=dims,
                                ns_dtype=jnp.dtype(_ns_dtype(t)), ns_coeffs=t.muon_ns_coeffs,
                                row_eq=t.muon_eq)]
    if t.muon_normuon_beta2:  # NorMuon: per-neuron step sizes (muon.scale_by_normuon)
        steps.append(muon.scale_by_normuon(t.muon_normuon_beta2, dims))
    decay = (muon.add_cautious_decayed_weights if t.muon_cautious_wd
             else optax.add_decayed_weights)(t.muon_weight_decay)
    return optax.chain(*steps, _scale_by_width(dims), decay,
                       optax.scale_by_learning_rate(learning_rate(t, t.muon_lr)))


def _ns_dtype(t) -> str:
    """train.muon_ns_dtype; `auto` left unresolved (a config that did not pass through
    train/resolve.py, which makes it the model's matmul dtype) is float32."""
    return "float32" if t.muon_ns_dtype == "auto" else t.muon_ns_dtype


def _group(path, muon_on: bool, value_embed_group: bool) -> str:
    """Which optimizer trains the parameter at `path`: muon (the hidden matrices, under
    train.optimizer=muon), value_embed (model.value_embeds' tables, with train.value_embed_lr)
    or adamw (everything else)."""
    if muon_on and muon_dims(path) is not None:
        return "muon"
    if value_embed_group and str(getattr(path[0], "key", path[0])).startswith("value_embed_"):
        return "value_embed"
    return "adamw"


def make_optimizer(t, d_model: int = 0) -> optax.GradientTransformation:
    """AdamW (or Muon with AdamW, `train.optimizer`) with `learning_rate(t)`, weight decay by
    role, clipping by global norm (of the whole gradient, before either group); with
    `train.lr_base_width` AdamW's hidden matrices at lr·lr_base_width/d_model (width_lr.py:
    under Muon, AdamW trains none, so the rule changes nothing there)."""
    adamw = optax.adamw(learning_rate(t), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay,
                        mask=decay_mask)
    if t.lr_base_width:
        if d_model <= 0:
            raise ValueError("train.lr_base_width needs the model's d_model")
        adamw = width_lr.scale_hidden_matrices(adamw, width_lr.multiplier(t, d_model))
    groups = {"adamw": adamw}
    if t.optimizer == "muon":
        groups["muon"] = _muon(t)
    if t.value_embed_lr:  # model.value_embeds' tables at a rate of their own (nanochat's)
        groups["value_embed"] = optax.adamw(learning_rate(t, t.value_embed_lr), b1=t.b1,
                                            b2=t.b2, weight_decay=t.weight_decay,
                                            mask=decay_mask)
    if len(groups) > 1:
        muon_on = t.optimizer == "muon"
        labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
            lambda path, _: _group(path, muon_on, bool(t.value_embed_lr)), params)
        adamw = optax.partition(groups, labels)
    if t.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw)
    return adamw

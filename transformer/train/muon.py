"""Muon's update with the Newton-Schulz steps of same-shaped matrices batched together.

    transform = scale_by_muon(beta, ns_steps, dims_fn)   # optax.contrib.scale_by_muon's math
    updates   = orthogonalize(tree, dims)                # every matrix of the tree, grouped

The arithmetic is optax's (optax.contrib.scale_by_muon, Nesterov momentum, Frobenius
preconditioning, the quintic iteration X <- a X + (b A + c A²) X with A = X Xᵀ), and so is the
state (optax's MuonState: a checkpoint of either loads in the other). What differs is how the
work is laid out. optax orthogonalises each parameter on its own: 5 iterations x 3 matmuls for
each of the 28 matrices of the quick start, 420 small dots a step, each paying XLA-CPU's
fixed per-op cost (a 128 x 128 x 128 product is 4 MFLOP: microseconds of arithmetic). Here
the matrices are first brought to optax's own (rows <= columns) orientation, then grouped
by shape and stacked, so each iteration is 3 batched dots per shape: with the quick start's
16 matrices of 128 x 128 (q, k, v, out) and 12 of 128 x 168 (the MLP's, the projection
transposed; SwiGLU's width 2/3 of d_ff=256, rounded to 8) that is 30 dots a step instead of
420. Each matrix is still orthogonalised alone
(the batch axis is never contracted), so the result equals optax's up to float rounding
(tests/test_optimizer.py checks it against optax.contrib.orthogonalize_via_newton_schulz).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon as _optax_scale_by_muon
from optax.contrib._muon import MuonState  # the state optax's scale_by_muon keeps


def _is_dims(x) -> bool:
    return isinstance(x, MuonDimensionNumbers)


def _axes(x, dims: MuonDimensionNumbers):
    """(batch axes, reduction axes, output axes) of x, non-negative, as optax reads them."""
    def norm(a):
        return tuple(i % x.ndim for i in ((a,) if isinstance(a, int) else a))
    reduction, output = norm(dims.reduction_axis), norm(dims.output_axis)
    if set(reduction) & set(output):
        raise ValueError(f"reduction axes {reduction} and output axes {output} overlap")
    batch = tuple(i for i in range(x.ndim) if i not in reduction + output)
    return batch, reduction, output


def _to_matrices(x, dims):
    """x as [n, rows, cols] with rows <= cols (optax transposes a tall matrix first: the
    iteration's products are then over the smaller side), and the inverse function."""
    batch, reduction, output = _axes(x, dims)
    order = batch + reduction + output
    shape = lambda axes: tuple(x.shape[a] for a in axes)  # noqa: E731
    fan_in, fan_out = math.prod(shape(reduction)), math.prod(shape(output))
    m = x.transpose(order).reshape(math.prod(shape(batch)), fan_in, fan_out)
    tall = fan_in > fan_out
    if tall:
        m = m.swapaxes(1, 2)
    inverse_order = tuple(sorted(range(x.ndim), key=lambda i: order[i]))

    def back(m):
        if tall:
            m = m.swapaxes(1, 2)
        return m.reshape(shape(batch) + shape(reduction) + shape(output)).transpose(inverse_order)
    return m, back


# Polar Express's triples for 5 iterations (Amsel, Persson, Musco, Gower 2025, arXiv
# 2505.16932: safety factor 2e-2, cushion 2), the values nanochat's Muon uses. Step i applies
# row i; a Frobenius-normalised start has every singular value in (0, 1], and after the 5
# steps they lie near 1 (tests/test_optimizer.py measures how near, against the quintic).
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def coefficients(kind: str, state_coeffs, ns_steps: int):
    """The iteration's coefficients: `state_coeffs` (optax's fixed triple, kept in its
    MuonState) for `quintic`, else a [ns_steps, 3] table, one triple per step."""
    if kind == "quintic":
        return state_coeffs
    if kind == "polar_express":
        if ns_steps > len(POLAR_EXPRESS):
            raise ValueError(f"train.muon_ns_coeffs=polar_express has triples for "
                             f"{len(POLAR_EXPRESS)} steps; train.muon_ns_steps={ns_steps}")
        return jnp.asarray(POLAR_EXPRESS[:ns_steps], jnp.float32)
    raise ValueError(f"unknown Newton-Schulz coefficients {kind!r}")


def newton_schulz(x_NRC, coeffs, ns_steps: int, eps: float = 1e-8, dtype=None):
    """optax's Frobenius-preconditioned quintic Newton-Schulz, on a stack of N matrices
    [N, R, C] (R <= C) at once: each matrix is normalised and iterated on its own."""
    norm_N11 = jnp.sqrt(jnp.sum(jnp.square(x_NRC), axis=(1, 2), keepdims=True))
    return iterate(x_NRC / (norm_N11 + eps), coeffs, ns_steps, dtype)


def iterate(x_NRC, coeffs, ns_steps: int, dtype=None):
    """The quintic iteration alone, each matrix of the stack on its own. `coeffs` is one
    (a, b, c) for every step, or a [ns_steps, 3] table of one per step (Polar Express).
    `dtype` (default: x's) is the matmuls' input dtype; they accumulate, and the iterate
    stays, in x's dtype (bfloat16 inputs: the rounding modded-nanogpt's GPU Muon runs its
    whole iteration in)."""
    table = coeffs.astype(x_NRC.dtype)
    table = table[None].repeat(ns_steps, 0) if table.ndim == 1 else table

    def dot(spec, a, b):
        if dtype is None or dtype == x_NRC.dtype:
            return jnp.einsum(spec, a, b)
        return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                          preferred_element_type=x_NRC.dtype)

    for step in range(ns_steps):
        c = table[step]
        a_NRR = dot("nrc,nsc->nrs", x_NRC, x_NRC)  # X Xᵀ
        b_NRR = c[1] * a_NRR + c[2] * dot("nrs,nst->nrt", a_NRR, a_NRR)
        x_NRC = c[0] * x_NRC + dot("nrs,nsc->nrc", b_NRR, x_NRC)
    return x_NRC


def orthogonalize(tree, dims_tree, coeffs, ns_steps: int, eps: float = 1e-8, dtype=None):
    """Every matrix of `tree` (as `dims_tree`'s MuonDimensionNumbers see it) orthogonalised,
    matrices of one shape and dtype in one batched Newton-Schulz (matmul inputs in `dtype`)."""
    leaves, treedef = jax.tree.flatten(tree)
    dims = treedef.flatten_up_to(dims_tree)
    matrices, backs = zip(*(_to_matrices(x, d) for x, d in zip(leaves, dims))) if leaves else ((), ())
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(matrices):
        groups.setdefault((m.shape[1:], m.dtype), []).append(i)
    out = [None] * len(leaves)
    for members in groups.values():
        stacked = jnp.concatenate([matrices[i] for i in members]) if len(members) > 1 else (
            matrices[members[0]])
        done = newton_schulz(stacked, coeffs, ns_steps, eps, dtype)
        offsets = [0]
        for i in members:
            offsets.append(offsets[-1] + matrices[i].shape[0])
        for i, lo, hi in zip(members, offsets, offsets[1:]):
            out[i] = backs[i](done[lo:hi])
    return jax.tree.unflatten(treedef, out)


def scale_by_muon(beta: float, ns_steps: int, dims_fn, nesterov: bool = True,
                  eps: float = 1e-8, ns_dtype=None,
                  ns_coeffs: str = "quintic", row_eq: bool = False) -> optax.GradientTransformation:
    """optax.contrib.scale_by_muon (its default coefficients and preconditioning), with the
    orthogonalisation batched by `orthogonalize`; `dims_fn(updates)` gives each leaf's
    MuonDimensionNumbers, `ns_dtype` the Newton-Schulz matmuls' input dtype (None: the
    updates'), `ns_coeffs` the iteration's coefficients (`coefficients`). The state is
    optax's either way (Polar Express's table is a constant, not state). `row_eq`: MuonEq
    (`equilibrate_rows`) on the momentum before it is orthogonalised."""
    reference = _optax_scale_by_muon(beta=beta, nesterov=nesterov, ns_steps=ns_steps, eps=eps,
                                     weight_dimension_numbers=dims_fn)

    def update(updates, state, params=None):
        del params
        # Momentum and its bias correction as optax computes them.
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        if nesterov:
            mu_hat = jax.tree.map(
                lambda m, g: beta * m + (1 - beta) * g,
                optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                optax.tree.bias_correction(updates, beta, count))
        else:
            mu_hat = optax.tree.bias_correction(mu, beta, count)
        if row_eq:
            mu_hat = jax.tree.map(equilibrate_rows, mu_hat, dims_fn(updates))
        updates = orthogonalize(mu_hat, dims_fn(updates),
                                coefficients(ns_coeffs, state.ns_coeffs, ns_steps), ns_steps,
                                eps, ns_dtype)
        return updates, MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(reference.init, update)


# nanochat's additions to Muon (its optim.py), each off by default (train.muon_eq,
# train.muon_normuon_beta2, train.muon_cautious_wd; docs/speedrun.md screens them).

def equilibrate_rows(x, dims: MuonDimensionNumbers, eps: float = 1e-6):
    """MuonEq: every output neuron's weights (its row of the fan_out x fan_in matrix, a
    slice along the reduction axes) rescaled to the matrix's mean row norm ‖X‖_F / √fan_out,
    so the spectrum the orthogonalisation starts from is better conditioned. Matrices of a
    stack (the batch axes) each keep their own norm."""
    batch, reduction, output = _axes(x, dims)
    fan_out = math.prod(x.shape[a] for a in output)
    x32 = x.astype(jnp.float32)
    row = jnp.sqrt(jnp.sum(jnp.square(x32), axis=reduction, keepdims=True))
    target = jnp.sqrt(jnp.sum(jnp.square(x32), axis=reduction + output, keepdims=True) / fan_out)
    return (x32 * (target / jnp.maximum(row, eps))).astype(x.dtype)


def _normuon_view(x, dims):
    """x as [n, R, C] (R <= C, `_to_matrices`) and its inverse: NorMuon keeps one second
    moment per column, the longer side (per output neuron for a square matrix: nanochat's)."""
    return _to_matrices(x, dims)


def scale_by_normuon(beta2: float, dims_fn, eps: float = 1e-10) -> optax.GradientTransformation:
    """NorMuon (Li et al. 2025, arXiv 2510.05491) as nanochat applies it to an orthogonalised
    update U ([n, R, C], R <= C): v ← β2·v + (1-β2)·mean_R(U²) per column, U' = U / √v, then
    U' rescaled to U's Frobenius norm, so only the split of the step between neurons changes,
    never its size. v starts at 0 (the first step's v is (1-β2)·mean_R(U²), and the rescale
    makes its scale irrelevant)."""

    def init(params):
        dims = dims_fn(params)
        return jax.tree.map(
            lambda p, d: jnp.zeros(_normuon_view(p, d)[0].shape[:1] + (1,) +
                                   _normuon_view(p, d)[0].shape[2:], jnp.float32),
            params, dims)

    def update(updates, state, params=None):
        del params
        dims = dims_fn(updates)

        def one(u, v, d):
            m, back = _normuon_view(u, d)
            m32 = m.astype(jnp.float32)
            v = beta2 * v + (1 - beta2) * jnp.mean(jnp.square(m32), axis=1, keepdims=True)
            scaled = m32 * jax.lax.rsqrt(jnp.maximum(v, eps))
            norm = lambda a: jnp.sqrt(jnp.sum(jnp.square(a), axis=(1, 2), keepdims=True))  # noqa: E731
            scaled = scaled * (norm(m32) / jnp.maximum(norm(scaled), eps))
            return back(scaled.astype(u.dtype)), v

        pairs = jax.tree.map(one, updates, state, dims)
        outer = jax.tree.structure(updates)
        new_updates, new_state = jax.tree.transpose(outer, jax.tree.structure((0, 0)), pairs)
        return new_updates, new_state

    return optax.GradientTransformation(init, update)


def add_cautious_decayed_weights(weight_decay: float) -> optax.GradientTransformation:
    """Cautious weight decay (nanochat's Muon): u + wd·p only where u·p >= 0, that is where
    the step -lr·u already moves the weight towards 0; elsewhere the update alone."""

    def update(updates, state, params):
        decayed = jax.tree.map(
            lambda u, p: u + weight_decay * jnp.where(u * p >= 0, p, 0).astype(u.dtype),
            updates, params)
        return decayed, state

    # optax.add_decayed_weights' (empty) state: a checkpoint loads with either decay.
    return optax.GradientTransformation(optax.add_decayed_weights(weight_decay).init, update)

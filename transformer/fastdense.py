"""Dense layers and attention with hand-written backward passes: the fast path for XLA-CPU.

    y = x W + b                     forward: one matmul, float32 accumulation
    dx = dy W^T                     backward, written out by hand (jax.custom_vjp)
    dW = X^T dy                     bf16: X^T materialised as x.transpose(..).reshape(I, N)

    attention (training)            causal, upper triangle skipped, softmax in float32;
                                    backward dV = P^T dO, dS = P ⊙ (dP - rowsum(dP ⊙ P)),
                                    dQ = dS K, dK = dS^T Q, all in the compute dtype

Why: left to autodiff, XLA-CPU folds the transposes of the backward into `a.T @ b` dots. In
bfloat16 those run ~3-5x slower than `a @ b` (~150-250 against ~500-800 GFLOP/s on AMX), so
the bf16 backward keeps an explicitly laid-out X^T. In float32 the folded dot is almost as
fast and the explicit transpose is not (XLA fused the GELU into it: 50-70 ms per activation),
so the float32 backward lets XLA fold. Autodiff through attention also casts and copies its
[B, H, T, T] tensors several times over; the hand-written backward does each matmul once in
the compute dtype, and skipping the upper triangle saves a quarter of the work. Together
these took the bench's training step from ~540 to ~375 ms (bf16) and ~850 to ~610 ms
(float32) on a 2-core Xeon (README, Performance). On GPU/TPU autodiff is already fast: use
`model.matmul = "plain"` (what `auto` picks there).

`model.matmul` picks the path (the parameters are the same in every mode, so a checkpoint
trained in one mode loads in another):
    plain      flax.linen.DenseGeneral, autodiff backward, `attention.causal_attention`
    fast_f32   this module, float32 inputs: the same numbers as `plain` up to summation order
    fast_bf16  this module, bfloat16 matmul inputs with float32 accumulation (mixed precision):
               parameters, activations between layers, softmax and loss stay float32

    dense = fastdense.factory(config, nn.Dense)   # nn.Dense in plain mode, else this layer
    y_BTF = dense(F, name="expand", kernel_init=..., bias_init=...)(x_BTD)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import attention
from transformer.fields import MATMUL_MODES  # noqa: F401  (declared with model.matmul)

_COMPUTE_DTYPE = {"fast_f32": "float32", "fast_bf16": "bfloat16"}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x_BTI, w_IO, compute_dtype):
    """x_BTI @ w_IO (any number of leading dims) with inputs cast to compute_dtype (a name) and a
    float32 result."""
    return jnp.dot(x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype),
                   preferred_element_type=jnp.float32)


def _matmul_fwd(x_BTI, w_IO, compute_dtype):
    x_c, w_c = x_BTI.astype(compute_dtype), w_IO.astype(compute_dtype)
    y_BTO = jnp.dot(x_c, w_c, preferred_element_type=jnp.float32)
    if compute_dtype == "bfloat16":
        # Keep X^T [I, B*T] for the weight gradient, transposed before the reshape: XLA folds
        # a plain `.T` into the dot (the slow `a.T @ b` kernel) but not a transpose+reshape.
        x_saved = jnp.moveaxis(x_c, -1, 0).reshape(x_c.shape[-1], -1)
    else:
        # In float32 the folded dot is nearly as fast, and the explicit transpose is not
        # cheap: XLA fused the GELU into it and took 50-70 ms per [4096, 1024] activation.
        x_saved = x_c.reshape(-1, x_c.shape[-1])
    # Residuals must be arrays: empty ones carry the primal dtypes to the backward pass.
    return y_BTO, (x_saved, w_c, jnp.empty((0,), x_BTI.dtype), jnp.empty((0,), w_IO.dtype))


def _matmul_bwd(compute_dtype, residuals, dy_BTO):
    x_saved, w_c, x_tag, w_tag = residuals
    dy_c = dy_BTO.astype(compute_dtype)
    dy_NO = dy_c.reshape(-1, dy_c.shape[-1])
    if compute_dtype == "bfloat16":
        dx_BTI = jnp.dot(dy_c, _transpose(w_c), preferred_element_type=jnp.float32)
        dw_IO = jnp.dot(x_saved, dy_NO, preferred_element_type=jnp.float32)  # X^T [I, N] @ dy
    else:
        dx_BTI = jnp.dot(dy_c, w_c.T, preferred_element_type=jnp.float32)
        dw_IO = jax.lax.dot_general(x_saved, dy_NO, (((0,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)  # X [N, I] . dy over N
    return dx_BTI.astype(x_tag.dtype), dw_IO.astype(w_tag.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _transpose(w_IO):
    """W^T as an array of its own. `dy @ w.T` gets folded into a dot that reads W transposed,
    which in bfloat16 ran at ~120 GFLOP/s against ~760 for this (docs/README-performance.md);
    a transpose between two reshapes is not folded."""
    I, O = w_IO.shape
    if O % 2:
        return w_IO.T
    return w_IO.reshape(I, 2, O // 2).transpose(1, 2, 0).reshape(O, I)


class DenseGeneral(nn.Module):
    """`nn.DenseGeneral` over the trailing `axis` dims, computed by `matmul` above.

    Same parameter names, shapes and initialisers as flax's DenseGeneral (kernel
    [*in_dims, *features], bias [*features]), so `plain` and `fast_*` share checkpoints.
    """

    features: int | tuple[int, ...]
    axis: int | tuple[int, ...] = -1
    use_bias: bool = True
    mode: str = "fast_f32"
    dtype: Any = None  # the output dtype (model.dtype); None: the input's
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros

    @nn.compact
    def __call__(self, x):
        features = tuple(self.features) if isinstance(self.features, (tuple, list)) else (
            self.features,)
        n_in = len(self.axis) if isinstance(self.axis, (tuple, list)) else 1
        axes = tuple(self.axis) if isinstance(self.axis, (tuple, list)) else (self.axis,)
        if sorted(a % x.ndim for a in axes) != list(range(x.ndim - n_in, x.ndim)):
            raise ValueError(f"fastdense.DenseGeneral contracts trailing axes only, got {axes}")
        in_dims = x.shape[-n_in:]
        kernel = self.param("kernel", self.kernel_init, in_dims + features, self.param_dtype)
        lead = x.shape[:-n_in]
        y_BTO = matmul(x.reshape(lead + (math.prod(in_dims),)),
                       kernel.reshape(math.prod(in_dims), math.prod(features)),
                       _COMPUTE_DTYPE[self.mode])
        y = y_BTO.reshape(lead + features)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, features, self.param_dtype)
        return y.astype(self.dtype or x.dtype)


def causal_attention(config, q_BHTK, k_BGTK, v_BGTK, window: int = 0):
    """Causal self-attention for training in the fast modes: `attention.causal_attention`
    (the upper triangle skipped) with the matmuls in the compute dtype (bfloat16 inputs,
    float32 accumulation in `fast_bf16`), the softmax in float32 and a hand-written backward
    (`_attend`). Returns out_BHTK; the weights are not returned (visualize.py uses `plain`)."""
    B, H, T, K = q_BHTK.shape
    G = k_BGTK.shape[1]
    R = H // G
    N = B * G  # key/value heads; each serves R query heads: X = R·T queries
    q_NRTK = q_BHTK.reshape(N, R, T, K)
    k_NTK, v_NTK = k_BGTK.reshape(N, T, K), v_BGTK.reshape(N, T, K)
    cdt = _COMPUTE_DTYPE[config.matmul]
    outs = []
    for start, stop in attention.causal_blocks(T):  # queries start..stop-1 see keys ..stop-1
        X = R * (stop - start)
        out_NXK = _attend(q_NRTK[:, :, start:stop].reshape(N, X, K), k_NTK[:, :stop],
                          v_NTK[:, :stop], R, start, window, cdt)
        outs.append(out_NXK.reshape(N, R, stop - start, K))
    return jnp.concatenate(outs, axis=2).reshape(B, H, T, K)


def _mask(X: int, S: int, R: int, q_offset: int, window: int):
    """mask_1XS for queries at positions q_offset .. S-1 (each of the R query heads of a
    key/value head, x = r·T + t) over keys 0 .. S-1: rows of `attention.causal_mask`."""
    mask_TS = attention.causal_mask(S, window)[0, 0, q_offset:]
    assert mask_TS.shape[0] * R == X, "queries must be the last positions of the keys"
    return jnp.tile(mask_TS, (R, 1))[None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _attend(q_NXK, k_NSK, v_NSK, R, q_offset, window, compute_dtype):
    """softmax(Q K^T / sqrt(K) + causal mask) V over N independent heads (float32 result)."""
    return _attend_fwd(q_NXK, k_NSK, v_NSK, R, q_offset, window, compute_dtype)[0]


def _attend_fwd(q_NXK, k_NSK, v_NSK, R, q_offset, window, compute_dtype):
    X, S, K = q_NXK.shape[1], k_NSK.shape[1], q_NXK.shape[2]
    q_c, k_c, v_c = (a.astype(compute_dtype) for a in (q_NXK, k_NSK, v_NSK))
    scores_NXS = jnp.einsum("nxk,nsk->nxs", q_c, k_c, preferred_element_type=jnp.float32)
    scores_NXS = jnp.where(_mask(X, S, R, q_offset, window), scores_NXS * K ** -0.5,
                           attention.MASKED)
    p_NXS = attention.softmax(scores_NXS)
    p_c = p_NXS.astype(compute_dtype)
    out_NXK = jnp.einsum("nxs,nsk->nxk", p_c, v_c, preferred_element_type=jnp.float32)
    return out_NXK.astype(q_NXK.dtype), (q_c, k_c, v_c, p_c)


def _attend_bwd(R, q_offset, window, compute_dtype, residuals, dout_NXK):
    q_c, k_c, v_c, p_c = residuals
    K = q_c.shape[2]
    dout_c = dout_NXK.astype(compute_dtype)
    dv_NSK = jnp.einsum("nxs,nxk->nsk", p_c, dout_c, preferred_element_type=jnp.float32)
    dp_NXS = jnp.einsum("nxk,nsk->nxs", dout_c, v_c, preferred_element_type=jnp.float32)
    p_NXS = p_c.astype(jnp.float32)
    # softmax backward: dS = P ⊙ (dP - rowsum(dP ⊙ P)); masked entries have P = 0.
    ds_NXS = p_NXS * (dp_NXS - jnp.sum(dp_NXS * p_NXS, axis=-1, keepdims=True)) * K ** -0.5
    ds_c = ds_NXS.astype(compute_dtype)
    dq_NXK = jnp.einsum("nxs,nsk->nxk", ds_c, k_c, preferred_element_type=jnp.float32)
    dk_NSK = jnp.einsum("nxs,nxk->nsk", ds_c, q_c, preferred_element_type=jnp.float32)
    return dq_NXK, dk_NSK, dv_NSK


_attend.defvjp(_attend_fwd, _attend_bwd)


def decode_setup(config, params, batch: int):
    """(config, params) for a decode loop over `batch` rows.

    In `fast_bf16` mode the dense kernels are cast to bfloat16 once, before the token loop
    (each step would otherwise read the float32 weights and write bf16 copies). A single row
    keeps float32 weights (`fast_f32`): decoding one row is bound by reading the weights, and
    XLA-CPU's float32 matrix-vector product beat its bfloat16 one here (about 480 against
    610 us per token for the bench model), so one row decodes faster and more precisely.
    """
    if config.matmul != "fast_bf16":
        return config, params
    if batch == 1:
        return dataclasses.replace(config, matmul="fast_f32"), params
    return config, jax.tree_util.tree_map_with_path(
        lambda path, x: x.astype(jnp.bfloat16) if getattr(path[-1], "key", None) == "kernel"
        else x, params)


def factory(config, plain=nn.DenseGeneral) -> Callable[..., nn.Module]:
    """The dense-layer constructor the model should use for `config.matmul`: `plain` (flax's
    nn.Dense or nn.DenseGeneral, unchanged) or this module's DenseGeneral, called alike."""
    if config.matmul == "plain":
        return functools.partial(plain, dtype=config.dtype, param_dtype=config.param_dtype)
    return functools.partial(DenseGeneral, mode=config.matmul, dtype=config.dtype,
                             param_dtype=config.param_dtype)

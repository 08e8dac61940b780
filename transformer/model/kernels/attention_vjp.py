"""Attention with a hand-written backward pass: the CPU fast path's attention.

The forward pass is `attention.dot_product_attention` itself, called with the compute dtype
(bfloat16 inputs and float32 accumulation in `fast_bf16`); only the backward is written
here. With P the weights (float32 softmax) and dO the gradient of the output:

    dV = P^T dO        dP = dO V^T        dS = P ⊙ (dP - rowsum(dP ⊙ P)) / sqrt(d_k)
    dQ = dS K          dK = dS^T Q

each matmul once, in the compute dtype. Left to autodiff, XLA-CPU casts and copies the
[B, H, T, T] tensors several times over (docs/performance.md). The weights are a second
output, so the model can sow them like every other path; their cotangent is ignored (nothing
differentiates through a sown value), and when nothing reads them XLA drops them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformer.model import attention


def dot_product_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype: str):
    """`attention.dot_product_attention(..., compute_dtype)`: the same (out_BHTK, weights_BHTS),
    differentiated by the backward pass below."""
    return _attend(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype):
    return attention.dot_product_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype)


def _attend_fwd(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype):
    out_BHTK, weights_BHTS = attention.dot_product_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS,
                                                             compute_dtype)
    # The inputs as the forward's matmuls read them; XLA computes each cast once for both.
    saved = tuple(x.astype(compute_dtype) for x in (q_BHTK, k_BGSK, v_BGSK, weights_BHTS))
    # Residuals must be arrays: empty ones carry the primal dtypes to the backward pass.
    tags = tuple(jnp.empty((0,), x.dtype) for x in (q_BHTK, k_BGSK, v_BGSK))
    return (out_BHTK, weights_BHTS), saved + tags


def _attend_bwd(compute_dtype, residuals, cotangents):
    q_BHTK, k_BGSK, v_BGSK, p_BHTS, q_tag, k_tag, v_tag = residuals
    dout_BHTK, _ = cotangents  # the weights' cotangent: sown values are never differentiated
    B, H, T, K = q_BHTK.shape
    G, S = k_BGSK.shape[1], k_BGSK.shape[2]
    N, X = B * G, (H // G) * T  # the forward's layout: N key/value heads, X = R·T queries each
    q_NXK, p_NXS = q_BHTK.reshape(N, X, K), p_BHTS.reshape(N, X, S)
    k_NSK, v_NSK = k_BGSK.reshape(N, S, K), v_BGSK.reshape(N, S, K)
    dout_NXK = dout_BHTK.reshape(N, X, K).astype(compute_dtype)
    # dV and dK contract over the queries. In bfloat16 they are Pᵀ·dO and dSᵀ·Q with Pᵀ and
    # dSᵀ laid out as arrays of their own (`_transpose`): as `a.T @ b` dots XLA-CPU ran them
    # through its slow converting DotThunk. In float32 the folded dot is as fast and the
    # copies are not free (as in dense.py; docs/performance.md).
    t = _transpose if compute_dtype == "bfloat16" else lambda x: x.swapaxes(1, 2)
    dv_NSK = jnp.einsum("nsx,nxk->nsk", t(p_NXS), dout_NXK, preferred_element_type=jnp.float32)
    dp_NXS = jnp.einsum("nxk,nsk->nxs", dout_NXK, v_NSK, preferred_element_type=jnp.float32)
    p32_NXS = p_NXS.astype(jnp.float32)
    # softmax backward: dS = P ⊙ (dP - rowsum(dP ⊙ P)); masked entries have P = 0.
    ds_NXS = p32_NXS * (dp_NXS - jnp.sum(dp_NXS * p32_NXS, axis=-1, keepdims=True)) * K ** -0.5
    ds_NXS = ds_NXS.astype(compute_dtype)
    dq_NXK = jnp.einsum("nxs,nsk->nxk", ds_NXS, k_NSK, preferred_element_type=jnp.float32)
    dk_NSK = jnp.einsum("nsx,nxk->nsk", t(ds_NXS), q_NXK, preferred_element_type=jnp.float32)
    return (dq_NXK.reshape(B, H, T, K).astype(q_tag.dtype),
            dk_NSK.reshape(B, G, S, K).astype(k_tag.dtype),
            dv_NSK.reshape(B, G, S, K).astype(v_tag.dtype),
            None)  # the mask is boolean: no gradient


_attend.defvjp(_attend_fwd, _attend_bwd)


def _transpose(x_NXS):
    """x with its last two axes swapped, as an array of its own: a plain swapaxes gets
    folded into the consuming dot (the slow `a.T @ b` kernel), a transpose between two
    reshapes does not (as kernels/dense.py's transposed). An odd last axis: swapaxes."""
    N, X, S = x_NXS.shape
    if S % 2:
        return x_NXS.swapaxes(1, 2)
    return x_NXS.reshape(N, X, 2, S // 2).transpose(0, 2, 3, 1).reshape(N, S, X)

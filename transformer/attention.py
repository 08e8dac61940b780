"""Scaled dot-product attention and the masks that decide who may look at whom.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

Shapes: B batch, H heads, T query positions, S key positions, K head dim (d_k).
The scores and the softmax run in float32 whatever the compute dtype: a bfloat16 softmax
over a long row loses the small weights.
"""

from __future__ import annotations

import jax.numpy as jnp

# A large negative number rather than -inf: a row with every key masked (a padding slot)
# then gets uniform weights instead of NaN, and its output is never read.
MASKED = -1e30


def causal_mask(T: int) -> jnp.ndarray:
    """mask_1x1xTxT[i, j] = True where query i may see key j, i.e. j <= i."""
    return jnp.tril(jnp.ones((T, T), dtype=bool))[None, None]


def cache_mask(start_B: jnp.ndarray, index, T: int, S: int) -> jnp.ndarray:
    """Which cache slots each new query may see.

    The T new tokens sit in slots index .. index+T-1 of an S-slot cache. Row b's prompt was
    left-padded, so its real tokens start at slot start_B[b]. Query t sees slot j when
    start_B[b] <= j <= index + t: filled, not padding, not in the future.
    Returns mask_Bx1xTxS.
    """
    slot_S = jnp.arange(S)
    query_slot_T = index + jnp.arange(T)
    filled_TxS = slot_S[None, :] <= query_slot_T[:, None]
    real_BxS = slot_S[None, :] >= start_B[:, None]
    return (filled_TxS[None] & real_BxS[:, None])[:, None]


def dot_product_attention(q_BHTK, k_BHSK, v_BHSK, mask_BHTS):
    """softmax(Q K^T / sqrt(d_k)) V, with masked scores set to MASKED before the softmax.

    Returns (out_BHTK, weights_BHTS); the weights are float32 and rows sum to 1.
    """
    d_k = q_BHTK.shape[-1]
    scores_BHTS = jnp.einsum("bhtk,bhsk->bhts", q_BHTK, k_BHSK,
                             preferred_element_type=jnp.float32)
    scores_BHTS = scores_BHTS / jnp.sqrt(jnp.float32(d_k))
    scores_BHTS = jnp.where(mask_BHTS, scores_BHTS, MASKED)
    weights_BHTS = softmax(scores_BHTS)
    out_BHTK = jnp.einsum("bhts,bhsk->bhtk", weights_BHTS.astype(v_BHSK.dtype), v_BHSK)
    return out_BHTK, weights_BHTS


def softmax(x):
    """Numerically stable softmax over the last axis (subtract the row max first)."""
    x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    return e / jnp.sum(e, axis=-1, keepdims=True)

"""Scaled dot-product attention and the masks that decide who may look at whom.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

Shapes: B batch, H query heads, G key/value heads (H = G·R: R query heads share one K/V
head; G = H is multi-head, 1 < G < H grouped-query, G = 1 multi-query attention), T query
positions, S key positions, K head dim (d_k).
The scores and the softmax run in float32 whatever the compute dtype: a bfloat16 softmax
over a long row loses the small weights.

This file holds the forward arithmetic once. `dot_product_attention` takes a compute dtype
(bfloat16 matmul inputs with float32 accumulation, or the inputs' own dtype) and returns the
weights too, so they can be looked at; `causal_attention` runs it block by block over the
causal triangle. The CPU fast path (kernels/attention_vjp.py) wraps the same function in a
hand-written backward pass instead of writing it again. `jax_attention`
(`jax.nn.dot_product_attention`) computes the same output but never forms the weights: a
model with `attention_kernel=jax` or `cudnn` has no attention maps to show. It lets XLA build
the attention (`implementation=None`, which in jax 0.10 is XLA's own version on every
backend) unless `implementation="cudnn"` asks for cuDNN's fused flash attention, which needs
an NVIDIA GPU and bfloat16/float16 inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# A large negative number rather than -inf: a row with every key masked (a padding slot)
# then gets uniform weights instead of NaN, and its output is never read.
MASKED = -1e30

# Below 2 x this many positions `causal_attention` does not split: the work saved is smaller
# than the cost of the extra, smaller ops.
MIN_CAUSAL_BLOCK = 32


def causal_mask(T: int, window: int = 0) -> jnp.ndarray:
    """mask_1x1xTxT[i, j] = True where query i may see key j: j <= i, and with a sliding
    window w > 0 also i - j < w (the last w positions, itself included)."""
    i_T1, j_1T = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    mask_TxT = j_1T <= i_T1
    if window:
        mask_TxT &= i_T1 - j_1T < window
    return mask_TxT[None, None]


def cache_mask(start_B: jnp.ndarray, index, T: int, S: int, window: int = 0,
               ring: int | None = None) -> jnp.ndarray:
    """Which cache slots each new query may see.

    The T new tokens are the text's tokens index .. index+T-1 (counted in slots, padding
    included); token n sits in slot n mod `ring` of a cache of `ring` slots (default S),
    of which the first S are given. Row b's prompt was left-padded, so its real tokens start
    at token start_B[b]. Query t (token q = index + t) sees slot j when the token now held
    there, a = q - ((q - j) mod ring), is real and not in the future: start_B[b] <= a <= q;
    with a sliding window w > 0 also q - a < w. Before the cache wraps, a = j for j <= q
    (and a < 0, unseen, for the empty slots after q). `index` is one number shared by every
    row, or one per row ([B]: continuous batching, where each row is at its own point of its
    own text). Returns mask_Bx1xTxS.
    """
    ring = S if ring is None else ring
    slot_S = jnp.arange(S)
    index = jnp.asarray(index)
    # [T] for a shared index, [B, T] for one per row; everything below broadcasts over B.
    query_xT = (index[:, None] if index.ndim else index) + jnp.arange(T)
    age_xTxS = (query_xT[..., :, None] - slot_S) % ring  # how far back the held token is
    held_xTxS = query_xT[..., :, None] - age_xTxS
    seen_xTxS = held_xTxS >= 0
    if window:
        seen_xTxS &= age_xTxS < window
    real_BxTxS = held_xTxS >= start_B[:, None, None]
    return (seen_xTxS & real_BxTxS)[:, None]


def dot_product_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, compute_dtype=None):
    """softmax(Q K^T / sqrt(d_k)) V, with masked scores set to MASKED before the softmax.

    Query head h reads key/value head h // R (R = H / G). Both matmuls take their inputs in
    `compute_dtype` (None: the queries' dtype) and accumulate in float32. Returns
    (out_BHTK in the queries' dtype, weights_BHTS); the weights are float32, rows sum to 1.
    """
    B, H, T, d_k = q_BHTK.shape
    G, S = k_BGSK.shape[1], k_BGSK.shape[2]
    cdt = compute_dtype or q_BHTK.dtype
    # As matmuls batched over (B, G) (key/value heads): every reshape here is free, XLA
    # needs no transposed copy of K or V (which, for the KV cache, is a large array), and
    # batch and heads stay apart: merged into one axis (B·G), heads split over a tensor axis
    # could not stay split, and XLA gathered every head's Q, K and V on every chip.
    q_BGXK = q_BHTK.reshape(B, G, (H // G) * T, d_k).astype(cdt)  # X = R·T: a group's queries
    k_BGSK, v_BGSK = (x.astype(cdt) for x in (k_BGSK, v_BGSK))
    scores_BGXS = jnp.einsum("bgxk,bgsk->bgxs", q_BGXK, k_BGSK,
                             preferred_element_type=jnp.float32)
    scores_BHTS = scores_BGXS.reshape(B, H, T, S) / jnp.sqrt(jnp.float32(d_k))
    scores_BHTS = jnp.where(mask_BHTS, scores_BHTS, MASKED)
    weights_BHTS = softmax(scores_BHTS)
    weights_BGXS = weights_BHTS.reshape(B, G, -1, S).astype(cdt)
    out_BGXK = jnp.einsum("bgxs,bgsk->bgxk", weights_BGXS, v_BGSK,
                          preferred_element_type=jnp.float32)
    return out_BGXK.reshape(B, H, T, d_k).astype(q_BHTK.dtype), weights_BHTS


def causal_blocks(T: int) -> list[tuple[int, int]]:
    """How causal self-attention over T positions splits its queries: blocks (start, stop)
    where queries start .. stop-1 need keys 0 .. stop-1 only. Two halves (the first half never
    sees the second half's keys: 3/4 of the work), or one block below 2 x MIN_CAUSAL_BLOCK."""
    if T % 2 or T < 2 * MIN_CAUSAL_BLOCK:
        return [(0, T)]
    return [(0, T // 2), (T // 2, T)]


def causal_attention(q_BHTK, k_BGTK, v_BGTK, mask_BHTT, attend=dot_product_attention):
    """`attend` (`dot_product_attention`, or a function with its signature and results) for
    queries and keys at the same T positions under a causal mask (key t' <= query t, with or
    without a sliding window), skipping the upper triangle: each block of queries
    (`causal_blocks`) attends over the keys it can see, with the same result (the skipped
    weights are exactly 0). Returns (out_BHTK, weights_BHTT)."""
    T = q_BHTK.shape[2]
    outs, weights = [], []
    for start, stop in causal_blocks(T):
        out_BHXK, w_BHXS = attend(q_BHTK[:, :, start:stop], k_BGTK[:, :, :stop],
                                  v_BGTK[:, :, :stop], mask_BHTT[:, :, start:stop, :stop])
        outs.append(out_BHXK)
        # Only a caller that keeps the weights (sown for visualize.py) pays for this: XLA
        # drops the padding and concatenation when nothing reads them.
        weights.append(jnp.pad(w_BHXS, ((0, 0), (0, 0), (0, 0), (0, T - stop))))
    return jnp.concatenate(outs, axis=2), jnp.concatenate(weights, axis=2)


def jax_attention(q_BHTK, k_BGSK, v_BGSK, mask_BHTS, implementation=None):
    """The same output as `dot_product_attention` through `jax.nn.dot_product_attention`
    (which handles G < H itself). Returns out_BHTK only: this kernel never forms the weights,
    so there is nothing to sow or to look at. `implementation`: None lets XLA choose, "cudnn"
    demands cuDNN flash attention (an error where it cannot run)."""
    # jax.nn.dot_product_attention takes [batch, length, heads, head_dim].
    q_BTHK, k_BSGK, v_BSGK = (x.transpose(0, 2, 1, 3) for x in (q_BHTK, k_BGSK, v_BGSK))
    mask_BHTS = jnp.broadcast_to(mask_BHTS, (q_BHTK.shape[0], q_BHTK.shape[1],
                                             q_BHTK.shape[2], k_BGSK.shape[2]))
    out_BTHK = jax.nn.dot_product_attention(q_BTHK, k_BSGK, v_BSGK, mask=mask_BHTS,
                                            implementation=implementation)
    return out_BTHK.transpose(0, 2, 1, 3)


def jax_causal_attention(q_BHTK, k_BGTK, v_BGTK, window: int = 0, implementation=None):
    """`jax_attention` for queries and keys at the same T positions (training and scoring),
    told the mask is causal (`is_causal`, and a sliding window w as `local_window_size`
    (w - 1, 0)) instead of given a dense [B, H, T, T] one: cuDNN then runs its causal
    flash-attention kernel, where a dense mask becomes a bias it reads from memory (~400 MB
    a call for configs/gpt2_small.py) through its slower biased kernel."""
    q_BTHK, k_BTGK, v_BTGK = (x.transpose(0, 2, 1, 3) for x in (q_BHTK, k_BGTK, v_BGTK))
    out_BTHK = jax.nn.dot_product_attention(
        q_BTHK, k_BTGK, v_BTGK, is_causal=True,
        local_window_size=(window - 1, 0) if window else None, implementation=implementation)
    return out_BTHK.transpose(0, 2, 1, 3)


def softmax(x):
    """Numerically stable softmax over the last axis (subtract the row max first)."""
    x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    return e / jnp.sum(e, axis=-1, keepdims=True)

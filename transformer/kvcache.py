"""The KV cache: keys and values of every position seen so far, preallocated once.

Generation would otherwise recompute K and V for the whole prefix at every new token. The
cache holds, per layer, k and v for B batch rows × G key/value heads × S slots × K head dim,
with S = max_seq_len. G is `n_kv_heads`: multi-head attention caches all H heads,
grouped-query attention H/G times less, multi-query (G = 1) H times less. Its shape never
changes, so one compiled program serves the whole decode; new tokens are written in place at
a slot index shared by every row (prompts are left-padded so that they all end at the same
slot).

The layout is chosen for XLA-CPU, where decoding is bound by hidden copies, not FLOPs:
- each layer has its own arrays, so no step copies a stacked [L, ...] cache to take one out;
- heads come before slots, so attention reads K and V without transposing them;
- batch rows and heads are merged into one leading axis, [B·G, S, K]: attention is then a
  batched matmul over that axis with no relayout, and a batch of one has no size-1 dim for
  XLA to drop (which turned the in-place write into copies of every layer's cache).
`read` gives the [B, G, S, K] view (a free reshape).

Its dimensions are named `AXES` (of the [B, G, S, K] view) for sharding.py: on a mesh the
merged axis is split over the batch and head mesh axes, so each device holds and reads only
its own rows' and heads' keys and values.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

AXES = ("cache_batch", "cache_heads", "cache_length", "cache_head_dim")


def init_cache(batch: int, n_layers: int, n_kv_heads: int, max_seq_len: int, head_dim: int,
               dtype=jnp.float32) -> list[dict]:
    """An empty cache: a list over layers of {'k': [B·G, S, K], 'v': [B·G, S, K]} zeros."""
    shape = (batch * n_kv_heads, max_seq_len, head_dim)
    return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
            for _ in range(n_layers)]


def read(layer_cache: dict, batch: int):
    """(k_BGSK, v_BGSK): one layer's keys and values as [B, G, S, K] views."""
    return tuple(x.reshape(batch, -1, *x.shape[1:]) for x in (layer_cache["k"], layer_cache["v"]))


def write(layer_cache: dict, k_BGTK, v_BGTK, index) -> dict:
    """Writes T new keys and values at slots index .. index+T-1 (in place under jit)."""
    B = k_BGTK.shape[0]

    def put(x_NSK, new_BGTK):
        new_NTK = new_BGTK.reshape(-1, *new_BGTK.shape[2:]).astype(x_NSK.dtype)
        x_NSK = jax.lax.dynamic_update_slice_in_dim(x_NSK, new_NTK, index, axis=1)
        # Pinned so the update stays in place on each device's own piece (a no-op off a mesh).
        x_BGSK = nn.with_logical_constraint(x_NSK.reshape(B, -1, *x_NSK.shape[1:]), AXES)
        return x_BGSK.reshape(x_NSK.shape)

    return {"k": put(layer_cache["k"], k_BGTK), "v": put(layer_cache["v"], v_BGTK)}


def prefix(cache: list[dict], length: int) -> list[dict]:
    """Every layer's first `length` slots (zero slots appended when `length` is larger)."""
    def fit(x_NSK):
        S = x_NSK.shape[1]
        if S >= length:
            return x_NSK[:, :length]
        return jnp.pad(x_NSK, ((0, 0), (0, length - S), (0, 0)))
    return jax.tree.map(fit, cache)


def cache_bytes(cache: list[dict]) -> int:
    """How much memory the cache holds."""
    return sum(x.size * x.dtype.itemsize for layer in cache for x in layer.values())

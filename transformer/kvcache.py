"""The KV cache: keys and values of every position seen so far, preallocated once.

Generation would otherwise recompute K and V for the whole prefix at every new token. The
cache holds, per layer, k and v of shape [B, H, S, K] (batch, heads, slots, head dim) with
S = max_seq_len. Its shape never changes, so one compiled program serves the whole decode;
new tokens are written in place at a slot index shared by every row (prompts are
left-padded so that they all end at the same slot).

Heads come before slots ([B, H, S, K] rather than [B, S, H, K]) so that attention reads the
cache without a transpose, and each layer has its own arrays so that no step copies a
stacked [L, ...] cache to take one layer out.

Its dimensions are named `AXES` for sharding.py: on a mesh the cache is split over batch
rows and heads, so each device holds and reads only its own heads' keys and values.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

AXES = ("cache_batch", "cache_heads", "cache_length", "cache_head_dim")


def init_cache(batch: int, n_layers: int, n_heads: int, max_seq_len: int, head_dim: int,
               dtype=jnp.float32) -> list[dict]:
    """An empty cache: a list over layers of {'k': [B, H, S, K], 'v': [B, H, S, K]} zeros."""
    shape = (batch, n_heads, max_seq_len, head_dim)
    return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
            for _ in range(n_layers)]


def write(layer_cache: dict, k_BHTK, v_BHTK, index) -> dict:
    """Writes T new keys and values at slots index .. index+T-1 (in place under jit)."""
    k = jax.lax.dynamic_update_slice_in_dim(layer_cache["k"], k_BHTK.astype(layer_cache["k"].dtype),
                                            index, axis=2)
    v = jax.lax.dynamic_update_slice_in_dim(layer_cache["v"], v_BHTK.astype(layer_cache["v"].dtype),
                                            index, axis=2)
    # Pinned so the update stays in place on each device's own piece (a no-op off a mesh).
    return {"k": nn.with_logical_constraint(k, AXES), "v": nn.with_logical_constraint(v, AXES)}


def cache_bytes(cache: list[dict]) -> int:
    """How much memory the cache holds."""
    return sum(x.size * x.dtype.itemsize for layer in cache for x in layer.values())

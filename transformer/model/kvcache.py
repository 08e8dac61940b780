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
merged axis is split over the batch and head mesh axes (`row_spec`), so each device holds and
reads only its own rows' and heads' keys and values. A split of the merged axis gives each
device one contiguous run of it, while a device's (rows, heads) block of the view is
contiguous in plain b·G + g order only when it holds one row or all heads. So on a mesh whose
devices hold several rows and some of the heads, the merged axis is ordered device block by
device block (`_to_rows` / `_from_rows`): the cache then lives exactly where the view needs
it, and no step moves it between devices.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

AXES = ("cache_batch", "cache_heads", "cache_length", "cache_head_dim")


def init_cache(batch: int, n_layers: int, n_kv_heads: int, max_seq_len: int, head_dim: int,
               dtype=jnp.float32, smear_dim: int = 0) -> list[dict]:
    """An empty cache: a list over layers of {'k': [B·G, S, K], 'v': [B·G, S, K]} zeros.
    `smear_dim` = D (model.smear): layer 0 also holds 'x', [B·G, S, D/G], every slot's token
    embedding in the same layout (the smear reads the previous token's: gpt.smear_cache)."""
    shape = (batch * n_kv_heads, max_seq_len, head_dim)
    cache = [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
             for _ in range(n_layers)]
    if smear_dim:
        cache[0]["x"] = jnp.zeros(shape[:2] + (smear_dim // n_kv_heads,), dtype)
    return cache


def row_spec(rules=None) -> P:
    """How the [B·G, S, K] arrays are split: the merged axis over the mesh axes of
    `cache_batch` then `cache_heads`, the rest as their names say (rules: Flax logical-axis
    rules; default: those in scope)."""
    batch, heads, *rest = nn.logical_to_mesh_axes(AXES, rules)
    merged = tuple(a for axes in (batch, heads) if axes is not None
                   for a in ((axes,) if isinstance(axes, str) else axes))
    return P(merged or None, *rest)


def _blocks() -> tuple[int, int]:
    """(batch blocks, head blocks): how many pieces the mesh in scope cuts B and G into."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1, 1
    batch, heads, *_ = nn.logical_to_mesh_axes(AXES)

    def pieces(axes):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        return math.prod(mesh.shape[a] for a in axes)
    return pieces(batch), pieces(heads)


def _to_rows(x_BG, B: int, G: int):
    """[B, G, ...] → [B·G, ...] in the cache's row order."""
    nb, nt = _blocks()
    if nt > 1 and B // nb > 1:  # block by block: [nb, nt, B/nb, G/nt]
        x = x_BG.reshape(nb, B // nb, nt, G // nt, *x_BG.shape[2:])
        x_BG = jnp.swapaxes(x, 1, 2)
    return x_BG.reshape(B * G, *x_BG.shape[-2:])


def _from_rows(x_N, B: int):
    """[B·G, ...] in the cache's row order → [B, G, ...]."""
    nb, nt = _blocks()
    G = x_N.shape[0] // B
    if nt > 1 and B // nb > 1:
        x = jnp.swapaxes(x_N.reshape(nb, nt, B // nb, G // nt, *x_N.shape[1:]), 1, 2)
        return x.reshape(B, G, *x_N.shape[1:])
    return x_N.reshape(B, G, *x_N.shape[1:])


def read(layer_cache: dict, batch: int):
    """(k_BGSK, v_BGSK): one layer's keys and values as [B, G, S, K] views."""
    return tuple(_from_rows(layer_cache[name], batch) for name in ("k", "v"))


def write(layer_cache: dict, k_BGTK, v_BGTK, index) -> dict:
    """Writes T new keys and values at slots index .. index+T-1 (in place under jit).
    `index` is one slot for every row, or one per row ([B], continuous batching: each row's
    G heads are then written at its own slot: one scatter for a single new token, else one
    in-place update per row)."""
    B, G = k_BGTK.shape[:2]

    def put(x_NSK, new_BGTK):
        new_NTK = _to_rows(new_BGTK, B, G).astype(x_NSK.dtype)
        if jnp.ndim(index) == 1:
            # No mesh here: the rows are in plain b·G + g order.
            if new_NTK.shape[1] == 1:
                # A decode step: every row's one new entry in one scatter (in place under
                # donation), not B updates: a batch-16 chunk of configs/tiny's shape ran 6,810
                # ops instead of 7,922 and took 2.42 ms against 2.81 ms (2-vCPU Sapphire Rapids).
                slot_N = jnp.minimum(jnp.repeat(index, G), x_NSK.shape[1] - 1)  # as DUS clamps
                return x_NSK.at[jnp.arange(B * G), slot_N].set(
                    new_NTK[:, 0], unique_indices=True, indices_are_sorted=True)
            # A prefill: B dynamic_update_slices, each run in place by XLA-CPU.
            for b in range(B):
                x_NSK = jax.lax.dynamic_update_slice(x_NSK, new_NTK[b * G:(b + 1) * G],
                                                     (b * G, index[b], 0))
            return x_NSK
        x_NSK = jax.lax.dynamic_update_slice_in_dim(x_NSK, new_NTK, index, axis=1)
        if not jax.sharding.get_abstract_mesh().empty:
            # Pinned where sharding.cache_shardings puts the cache (the same `row_spec`), so
            # the update stays in place on each device's own piece.
            x_NSK = jax.lax.with_sharding_constraint(x_NSK, row_spec())
        return x_NSK

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

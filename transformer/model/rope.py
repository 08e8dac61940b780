"""Rotary position embeddings (RoPE; Su et al. 2021, arXiv:2104.09864).

Instead of adding a position vector to x, RoPE rotates each query and key by an angle
proportional to its absolute position p. Dimension pair i (of K/2) turns at frequency
θ_i = base^(-2i/K):

    rope(x, p)_i = (x_i cos pθ_i − x_{i+K/2} sin pθ_i,  x_{i+K/2} cos pθ_i + x_i sin pθ_i)

A rotation preserves dot products up to the difference of the angles, so
rope(q, p) · rope(k, s) depends on p − s only: attention sees relative positions, and the
cached keys, rotated once at their own positions, stay valid as decoding moves on.
Pairs are (i, i + K/2) (the "rotate half" layout of GPT-NeoX and LLaMA ports).

    q_BHTK = rope.apply(q_BHTK, positions_BT)
"""

from __future__ import annotations

import jax.numpy as jnp

BASE = 10_000.0


def apply(x_BHTK, positions_BT, base: float = BASE):
    """Rotates x at the given absolute positions, in float32; returns x's dtype."""
    K = x_BHTK.shape[-1]
    freq_F = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)  # F = K/2 frequencies
    angle_B1TF = positions_BT[:, None, :, None].astype(jnp.float32) * freq_F
    cos, sin = jnp.cos(angle_B1TF), jnp.sin(angle_B1TF)
    # x·cos + rotate_half(x)·sin over the whole width, with rotate_half(x) = (x2, x1) and the
    # sign folded into the sine table (−sin, sin): the same products as the pairs above, but
    # XLA-CPU fuses it ~1.7x faster than concatenating the two rotated halves (one
    # concatenate of x's halves instead of one of two computed halves; docs/performance.md).
    cos_B1TK = jnp.concatenate([cos, cos], axis=-1)
    sin_B1TK = jnp.concatenate([-sin, sin], axis=-1)
    x = x_BHTK.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = x * cos_B1TK + jnp.concatenate([x2, x1], axis=-1) * sin_B1TK
    return rotated.astype(x_BHTK.dtype)

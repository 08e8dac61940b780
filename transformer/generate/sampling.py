"""Logits → next token: greedy, temperature, top-k and top-p (nucleus) sampling.

Every knob is a traced value, not a Python constant, so changing the temperature, k, p or
the random key never recompiles the decode program:

    temperature == 0   greedy (argmax)
    top_k == 0         no top-k filter; otherwise keep the k most likely tokens
    top_p >= 1         no nucleus filter (every token stays, however small); otherwise keep
                       the smallest set of most likely tokens whose probability (after
                       temperature and top-k) reaches p

Ties at the top-k boundary are all kept. Filters compare against thresholds taken from
one sort of the logits, so they work for any k without a static `lax.top_k`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _per_row(knob):
    """A knob as it broadcasts against [B, V]: a scalar as is, one value per row as [B, 1]."""
    knob = jnp.asarray(knob)
    return knob[:, None] if knob.ndim == 1 else knob


def filter_logits(logits_BV, temperature, top_k, top_p):
    """Temperature-scaled logits with everything outside the top-k / top-p set at -inf.
    Each knob is one value for every row, or one per row ([B])."""
    logits_BV = logits_BV.astype(jnp.float32)
    temperature, top_k, top_p = map(_per_row, (temperature, top_k, top_p))
    V = logits_BV.shape[-1]
    scaled_BV = logits_BV / jnp.maximum(temperature, 1e-6)
    sorted_BV = jnp.sort(scaled_BV, axis=-1)[:, ::-1]  # descending

    # top-k: the k-th largest value is the smallest one kept.
    k = jnp.clip(top_k, 1, V)
    if k.ndim:
        kth_B1 = jnp.take_along_axis(sorted_BV, k - 1, axis=-1)
    else:
        kth_B1 = jax.lax.dynamic_slice_in_dim(sorted_BV, k - 1, 1, axis=-1)
    kth_B1 = jnp.where(top_k > 0, kth_B1, -jnp.inf)
    sorted_BV = jnp.where(sorted_BV >= kth_B1, sorted_BV, -jnp.inf)

    # top-p: keep a sorted token while the probability mass before it is still below p. The
    # mass is an exclusive running sum compared with p times the float32 total: a float32
    # cumsum reaches the total (or 1.0) well before the end of a large vocabulary, so
    # "mass before < 1" would drop the tail; p >= 1 keeps every token outright.
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    mass_BV = jnp.cumsum(probs_BV, axis=-1)
    mass_before_BV = jnp.pad(mass_BV[:, :-1], ((0, 0), (1, 0)))
    kept_BV = (mass_before_BV < top_p * mass_BV[:, -1:]) | (top_p >= 1)
    kept_BV &= jnp.isfinite(sorted_BV)
    floor_B1 = jnp.min(jnp.where(kept_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)

    threshold_B1 = jnp.maximum(kth_B1, floor_B1)
    return jnp.where(scaled_BV >= threshold_B1, scaled_BV, -jnp.inf)


def argmax(x_BV):
    """jnp.argmax over the last axis (the first index of the largest value), as a max and a
    min of indices: two plain reductions. XLA-CPU runs jnp.argmax's one two-operand reduce
    as a scalar loop over everything fused into it: with the Gumbel noise fused in, a
    batch-8 draw over 256 tokens cost ~40 µs a step against ~4 µs this way (2-vCPU Sapphire
    Rapids). The same index as jnp.argmax for rows without NaN (logits; -inf where filtered)."""
    V = x_BV.shape[-1]
    first_BV = jnp.where(x_BV == jnp.max(x_BV, axis=-1, keepdims=True),
                         jnp.arange(V, dtype=jnp.int32), V)
    return jnp.min(first_BV, axis=-1)


def categorical(key, logits_BV):
    """jax.random.categorical(key, logits_BV) (the same Gumbel noise, so the same tokens),
    with `argmax`."""
    return argmax(logits_BV + jax.random.gumbel(key, logits_BV.shape, logits_BV.dtype))


# Threefry-2x32's rotations, four rounds each, alternating (Salmon et al. 2011; jax.random's).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (jax.random's hash) of the counters (x0, x1) under the key
    (k0, k1), all uint32 arrays that broadcast together: elementwise ops, fully unrolled, so
    XLA fuses them into one loop over the elements. jax.random's own threefry runs on XLA-CPU
    as a rolled while loop, which nested in the decode loop made XLA copy the cache."""
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for n in range(5):
        for r in _ROTATIONS[n % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
        x0 = x0 + ks[(n + 1) % 3]
        x1 = x1 + ks[(n + 2) % 3] + np.uint32(n + 1)
    return x0, x1


def gumbel_rows(keys_B2, V: int):
    """[B, V] float32 Gumbel noise, row b's from its own key only: exactly
    jax.random.gumbel(wrap_key_data(keys_B2[b]), (V,)) for a threefry key's data keys_B2[b]
    (its bits are threefry2x32(key, (0, j)) xor-ed, j the vocabulary index, as
    jax_threefry_partitionable draws them; then the same uniform in [tiny, 1) and -log(-log)).
    One computation over [B, V], not a random-bits call per row: its ops do not grow with B."""
    keys_B2 = jnp.asarray(keys_B2, jnp.uint32)
    j_1V = jnp.arange(V, dtype=jnp.uint32)[None, :]
    hi_BV, lo_BV = threefry2x32(keys_B2[:, :1], keys_B2[:, 1:], jnp.zeros_like(j_1V), j_1V)
    bits_BV = hi_BV ^ lo_BV
    one = jnp.float32(1.0)
    floats_BV = jax.lax.bitcast_convert_type(
        (bits_BV >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32) - one
    tiny = jnp.float32(jnp.finfo(jnp.float32).tiny)
    uniform_BV = jnp.maximum(tiny, floats_BV * (one - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform_BV))


def categorical_rows(logits_BV, keys_B2):
    """Row b drawn with its own threefry key, given as key data keys_B2[b] ([B, 2] uint32):
    jax.random.categorical(wrap_key_data(keys_B2[b]), logits_BV[b]) for each row (the same
    noise, `gumbel_rows`), one argmax for all rows."""
    return argmax(logits_BV + gumbel_rows(keys_B2, logits_BV.shape[-1]))


def sample(logits_BV, key, temperature, top_k, top_p):
    """One token per row: argmax when temperature is 0, else a draw from the filtered softmax.

    `key`: one key for the whole batch, or the data of one threefry key per row ([B, 2]
    uint32, `categorical_rows`). With row keys each row's draw depends on its own key and
    logits only, not on how many rows are drawn with it (one draw over [B, V] with one key
    gives row 0 other noise at B = 1 than at B = 2)."""
    def draw(logits_BV):
        filtered_BV = filter_logits(logits_BV, temperature, top_k, top_p)
        if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            return categorical_rows(filtered_BV, key)
        return categorical(key, filtered_BV)

    def greedy(logits_BV):
        return argmax(logits_BV)

    # A branch, not a select: greedy decoding skips the sort that the filters need.
    return jax.lax.cond(temperature > 0, draw, greedy, logits_BV).astype(jnp.int32)


def sample_rows(logits_BV, keys_B2, temperature_B, top_k_B, top_p_B):
    """One token per row, each row with its own knobs and key (keys_B2: a threefry key's data
    per row, as `categorical_rows` takes them): the
    token `sample` gives that row alone. For continuous batching, where rows of different
    requests share one step. Greedy rows take the argmax; the draw and the sort are skipped
    when no row needs them (the filters, with top_k = 0 and top_p = 1 everywhere, keep every
    finite logit: the temperature-scaled logits are then the filtered ones exactly)."""
    logits_BV = logits_BV.astype(jnp.float32)
    filtering = jnp.any((top_k_B > 0) | (top_p_B < 1))

    def draw(logits_BV):
        filtered_BV = jax.lax.cond(
            filtering, lambda x: filter_logits(x, temperature_B, top_k_B, top_p_B),
            lambda x: x / jnp.maximum(temperature_B, 1e-6)[:, None], logits_BV)
        return categorical_rows(filtered_BV, keys_B2)

    drawn_B = jax.lax.cond(jnp.any(temperature_B > 0), draw,
                           lambda x: jnp.zeros(x.shape[0], jnp.int32), logits_BV)
    return jnp.where(temperature_B > 0, drawn_B, argmax(logits_BV))

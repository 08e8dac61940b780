"""Sampler semantics: greedy, temperature, top-k and top-p never draw what they exclude."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.generate.sampling import filter_logits, sample

V = 32


def _draws(logits_BV, n, temperature=1.0, top_k=0, top_p=1.0):
    keys = jax.random.split(jax.random.key(0), n)
    draw = jax.jit(jax.vmap(lambda k: sample(logits_BV, k, temperature, top_k, top_p)))
    return np.asarray(draw(keys))  # [n, B]


@pytest.fixture
def logits():
    return jax.random.normal(jax.random.key(1), (4, V)) * 3.0


def test_temperature_zero_is_greedy(logits):
    assert np.all(_draws(logits, 50, temperature=0.0) == np.argmax(logits, -1))


def test_top_k_one_equals_greedy(logits):
    assert np.all(_draws(logits, 200, temperature=1.5, top_k=1) == np.argmax(logits, -1))


def test_tokens_outside_top_k_are_never_drawn(logits):
    draws = _draws(logits, 2000, temperature=2.0, top_k=5)
    top5 = np.argsort(-np.asarray(logits), axis=-1)[:, :5]
    for b in range(logits.shape[0]):
        assert set(draws[:, b]) <= set(top5[b])
        assert len(set(draws[:, b])) == 5  # and all five are reachable


def test_tokens_outside_top_p_are_never_drawn():
    probs = jnp.array([[0.5, 0.3, 0.15, 0.05]])
    logits = jnp.log(probs)
    for top_p, allowed in [(0.45, {0}), (0.7, {0, 1}), (0.9, {0, 1, 2}), (1.0, {0, 1, 2, 3})]:
        draws = _draws(logits, 3000, top_p=top_p)[:, 0]
        assert set(draws) == allowed, top_p


def test_small_temperature_approaches_greedy(logits):
    assert np.all(_draws(logits, 200, temperature=1e-3) == np.argmax(logits, -1))
    assert len(set(_draws(logits, 200, temperature=5.0)[:, 0])) > 5  # high temperature spreads


def test_unfiltered_draws_follow_the_softmax():
    logits = jnp.array([[2.0, 1.0, 0.0, -1.0]])
    draws = _draws(logits, 20000)[:, 0]
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, jax.nn.softmax(logits)[0], atol=0.015)


def test_filters_compose_and_are_traced_values(logits):
    """One compiled function serves every (temperature, k, p): they are arguments, not constants."""
    f = jax.jit(filter_logits)
    for t, k, p in [(1.0, 3, 1.0), (0.5, 0, 0.6), (2.0, 10, 0.3)]:
        kept = np.isfinite(np.asarray(f(logits, t, k, p)))
        if k:
            assert np.all(kept.sum(-1) <= k)
        assert np.all(kept.sum(-1) >= 1)
    assert f._cache_size() == 1


def test_top_p_one_keeps_every_token_of_a_large_vocabulary():
    """A float32 running sum reaches its total long before the end of 50,257 tokens when one
    token holds nearly all the mass: "mass before < 1" then dropped the tail."""
    V_large = 50257
    logits = jnp.concatenate([jnp.array([[12.0]]),
                              -jnp.linspace(0.0, 5.0, V_large - 1)[None]], axis=1)
    kept = np.isfinite(np.asarray(filter_logits(logits, 1.0, 0, 1.0)))
    assert kept.all()
    # p just below 1 keeps the head and cuts at the mass it names, not at a rounding artefact
    kept_p = np.isfinite(np.asarray(filter_logits(logits, 1.0, 0, 0.9)))
    assert kept_p[0, 0] and 0 < kept_p.sum() < V_large


def test_top_k_zero_and_top_p_one_filter_nothing(logits):
    scaled = np.asarray(filter_logits(logits, 0.5, 0, 1.0))
    np.testing.assert_allclose(scaled, np.asarray(logits) / 0.5, rtol=1e-6)


def _kept_by_sorting(scaled, k, p):
    """The filters' rule on one row, the way it reads: sort descending, keep the k largest
    (ties too), then walk down keeping each value while the probability strictly above it
    is below p times the total. float64 numpy. Returns the kept mask, and whether some
    value's mass lies within rounding of the cut (where float32 sums may decide either way)."""
    V = len(scaled)
    desc = np.sort(scaled)[::-1]
    kth = desc[min(max(k, 1), V) - 1] if k > 0 else -np.inf
    topk = np.where(scaled >= kth, scaled, -np.inf)
    if p >= 1:
        return np.isfinite(topk), False
    weights = np.exp(topk - topk.max())
    total, floor, close = weights.sum(), np.inf, False
    for v in np.unique(topk[np.isfinite(topk)])[::-1]:
        above = weights[topk > v].sum()
        close |= abs(above - p * total) < 1e-5 * total
        if above < p * total:
            floor = v
    return np.isfinite(topk) & (topk >= floor), close


def test_filters_keep_what_sorting_keeps():
    """filter_logits (thresholds searched bit by bit, no sort) keeps exactly the tokens the
    sort-based rule keeps: ties at the k-th value, repeated values at the top-p cut, -inf
    logits, k past the vocabulary, per-row knobs, a vocabulary that is not a multiple of
    the search's 128 lanes."""
    rng = np.random.default_rng(0)
    V_odd = 300
    checked = 0
    for trial in range(60):
        logits = rng.integers(-6, 6, (4, V_odd)).astype(np.float32)  # many ties
        if trial % 2:
            logits = (rng.normal(size=(4, V_odd)) * 3).astype(np.float32)
        logits[rng.random((4, V_odd)) < 0.2] = -np.inf
        temps = rng.choice([0.3, 1.0, 2.5], 4).astype(np.float32)
        ks = rng.choice([0, 1, 5, 40, 299, 300, 1000], 4).astype(np.int32)
        ps = rng.choice([0.05, 0.5, 0.9, 0.95, 1.0], 4).astype(np.float32)
        if trial % 3 == 0:  # one filter for the whole batch: the other one is not searched
            ks[:] = 0 if trial % 2 else ks[0]
            ps[:] = 1.0 if not trial % 2 else min(ps[0], 0.9)
        kept = np.isfinite(np.asarray(jax.jit(filter_logits)(logits, temps, ks, ps)))
        for b in range(4):
            scaled = logits[b].astype(np.float64) / temps[b]
            expected, close = _kept_by_sorting(scaled, int(ks[b]), float(ps[b]))
            if not close:
                np.testing.assert_array_equal(kept[b], expected, err_msg=f"{trial} {b}")
                checked += 1
    assert checked > 200


def test_skipping_the_sort_when_nothing_filters_draws_the_same_tokens():
    """With top_k = 0 and top_p = 1 (every row) the sampler skips the sort: what it draws from
    is filter_logits' output bit for bit (-inf logits and per-row temperatures included), so
    every token is the one the filtered draw gives; a row that filters still filters."""
    from transformer.generate.sampling import _filtered, categorical, sample_rows
    logits = np.array(jax.random.normal(jax.random.key(5), (4, V)) * 3.0)
    logits[:, ::7] = -np.inf
    temps = jnp.array([0.5, 1.0, 1.7, 3.0])
    for t in (0.7, temps):
        np.testing.assert_array_equal(jax.jit(_filtered)(logits, t, 0, 1.0),
                                      filter_logits(logits, t, 0, 1.0))
    keys = jax.random.split(jax.random.key(6), 200)
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(lambda k: sample(logits, k, 1.3, 0, 1.0)))(keys),
        jax.vmap(lambda k: categorical(k, filter_logits(logits, 1.3, 0, 1.0)))(keys))
    # per row: row 2 asks for its two likeliest tokens, the others filter nothing
    rows = jax.jit(jax.vmap(lambda k: sample_rows(
        logits, jax.random.key_data(jax.random.split(k, 4)), temps, jnp.array([0, 0, 2, 0]),
        jnp.ones(4))))(keys)
    assert set(np.asarray(rows[:, 2])) == set(np.argsort(-logits[2])[:2])
    assert len(set(np.asarray(rows[:, 3]))) > 2


def test_argmax_is_jnp_argmax_ties_and_minus_inf_included():
    """sampling.argmax (a max and a min of indices, fast on XLA-CPU) picks what jnp.argmax
    picks: the first of tied maxima, never a -inf (filtered) entry, for every row."""
    from transformer.generate.sampling import argmax
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 3, (64, V)).astype(np.float32)  # many ties
    x[rng.random((64, V)) < 0.5] = -np.inf
    x[:, 7] = np.where(np.isinf(x).all(-1), 0.0, x[:, 7])  # every row keeps one finite entry
    np.testing.assert_array_equal(jax.jit(argmax)(x), np.argmax(x, -1))


def test_draws_are_jax_random_categorical():
    """The draw is jax.random.categorical's (the same Gumbel noise and the same argmax), one
    threefry key for all rows, or one per row given as its key data (`categorical_rows`, the
    decoder's and the server's draw): row b's token is jax.random.categorical(key_b, its
    logits), whatever the other rows and their number."""
    from transformer.generate.sampling import categorical, categorical_rows
    logits = jax.random.normal(jax.random.key(4), (5, V)) * 2.0
    for seed in range(20):
        key = jax.random.key(seed)
        np.testing.assert_array_equal(jax.jit(categorical)(key, logits),
                                      jax.random.categorical(key, logits))
        keys_B2 = jax.random.key_data(jax.vmap(lambda b: jax.random.fold_in(key, b))(
            jnp.arange(5)))
        expected = [int(jax.random.categorical(jax.random.wrap_key_data(keys_B2[b]), logits[b]))
                    for b in range(5)]
        assert np.asarray(jax.jit(categorical_rows)(logits, keys_B2)).tolist() == expected


def test_row_noise_is_jax_random_gumbel_of_the_row_key_bit_for_bit():
    """sampling's unrolled Threefry-2x32 (one fused computation over [B, V], not a random-bits
    call per row) gives jax.random.bits of each row's threefry key exactly, and gumbel_rows
    jax.random.gumbel's noise: every row a function of its own key only."""
    from transformer.generate.sampling import gumbel_rows, threefry2x32
    keys = jax.random.split(jax.random.key(11), 16)
    keys_B2 = jax.random.key_data(keys)
    for n in (1, 257):
        j_1N = jnp.arange(n, dtype=jnp.uint32)[None]
        hi, lo = jax.jit(threefry2x32)(keys_B2[:, :1], keys_B2[:, 1:], jnp.zeros_like(j_1N), j_1N)
        np.testing.assert_array_equal(hi ^ lo, jnp.stack([jax.random.bits(k, (n,)) for k in keys]))
        np.testing.assert_array_equal(jax.jit(gumbel_rows, static_argnums=1)(keys_B2, n),
                                      jnp.stack([jax.random.gumbel(k, (n,)) for k in keys]))

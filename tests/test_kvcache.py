"""kvcache.py: the layout it documents, a write touches exactly its slots, a read is a free
view, and a prefix keeps the first slots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.generate import decode
from transformer.model import kvcache

B, G, S, K = 3, 2, 10, 4


def _random_cache(n_layers=2, seed=0):
    """A cache full of distinct values, so that a stray write shows."""
    shape = (B * G, S, K)
    return [{"k": jax.random.normal(jax.random.key(seed + 2 * i), shape),
             "v": jax.random.normal(jax.random.key(seed + 2 * i + 1), shape)}
            for i in range(n_layers)]


def test_cache_has_the_documented_layout(tiny_config):
    cache = decode.new_cache(config=tiny_config, batch=3)
    assert len(cache) == tiny_config.n_layers
    H, S_, K_ = tiny_config.n_heads, tiny_config.max_seq_len, tiny_config.head_dim
    assert all(layer["k"].shape == layer["v"].shape == (3 * H, S_, K_) for layer in cache)
    assert all(x.shape == (3, H, S_, K_) for x in kvcache.read(cache[0], batch=3))
    assert kvcache.cache_bytes(cache) == 2 * tiny_config.n_layers * 3 * H * S_ * K_ * 4


@pytest.mark.parametrize("index,T", [(0, 1), (4, 3), (9, 1), (0, S)])
def test_write_puts_keys_and_values_in_exactly_those_slots(index, T):
    layer = _random_cache(1)[0]
    k_BGTK = jax.random.normal(jax.random.key(10), (B, G, T, K))
    v_BGTK = jax.random.normal(jax.random.key(11), (B, G, T, K))
    new = jax.jit(kvcache.write)(layer, k_BGTK, v_BGTK, index)
    for name, written in (("k", k_BGTK), ("v", v_BGTK)):
        before, after = (np.asarray(x[name]).reshape(B, G, S, K) for x in (layer, new))
        slots = np.arange(S)
        inside = (slots >= index) & (slots < index + T)
        np.testing.assert_array_equal(after[:, :, inside], np.asarray(written))
        np.testing.assert_array_equal(after[:, :, ~inside], before[:, :, ~inside])


def test_read_is_a_free_view_row_major_over_batch_and_heads():
    layer = _random_cache(1)[0]
    k_BGSK, v_BGSK = kvcache.read(layer, B)
    for x_BGSK, x_NSK in ((k_BGSK, layer["k"]), (v_BGSK, layer["v"])):
        assert x_BGSK.shape == (B, G, S, K)
        for b in range(B):
            for g in range(G):
                np.testing.assert_array_equal(x_BGSK[b, g], x_NSK[b * G + g])
    # a view: reshapes only, no transpose or copy of the cache
    jaxpr = jax.make_jaxpr(lambda c: kvcache.read(c, B))(layer)
    assert {e.primitive.name for e in jaxpr.eqns} == {"reshape"}


def test_write_under_jit_with_donation_copies_nothing():
    layer = _random_cache(1)[0]
    k_BGTK = v_BGTK = jnp.ones((B, G, 1, K))
    write = jax.jit(kvcache.write, donate_argnums=0)
    hlo = write.lower(layer, k_BGTK, v_BGTK, jnp.int32(3)).compile().as_text()
    assert " copy(" not in hlo, "the in-place update became a copy of the cache"


@pytest.mark.parametrize("length", [4, S, S + 6])
def test_prefix_keeps_the_first_slots_and_pads_with_zeros(length):
    cache = _random_cache()
    cut = kvcache.prefix(cache, length)
    for layer, short in zip(cache, cut):
        for name in ("k", "v"):
            assert short[name].shape == (B * G, length, K)
            kept = min(length, S)
            np.testing.assert_array_equal(short[name][:, :kept], layer[name][:, :kept])
            assert not np.asarray(short[name][:, kept:]).any()


def test_init_cache_is_zeros_per_layer_in_the_dtype():
    cache = kvcache.init_cache(B, 3, G, S, K, jnp.bfloat16)
    assert len(cache) == 3 and all(x.dtype == jnp.bfloat16 for layer in cache
                                   for x in layer.values())
    assert kvcache.cache_bytes(cache) == 3 * 2 * B * G * S * K * 2
    assert not any(np.asarray(x, np.float32).any() for layer in cache for x in layer.values())

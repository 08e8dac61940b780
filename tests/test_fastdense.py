"""The CPU fast path (transformer/fastdense.py) gives the plain path's numbers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import attention, decode, fastdense, training
from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.model import GPT


def _loss_and_grads(config, params, tokens):
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
             "weights": jnp.ones(tokens[:, 1:].shape, jnp.float32)}
    return jax.jit(jax.value_and_grad(training.loss_fn), static_argnums=2)(params, batch, config)


@pytest.fixture(scope="module")
def setup(tiny_config, tiny_params):
    tokens = jax.random.randint(jax.random.key(1), (2, 33), 0, tiny_config.vocab_size)
    return tiny_config, tiny_params, tokens, _loss_and_grads(tiny_config, tiny_params, tokens)


def test_every_mode_has_the_same_parameters(tiny_config, tiny_params):
    for mode in fastdense.MATMUL_MODES:
        config = dataclasses.replace(tiny_config, matmul=mode)
        params = training.init_params(config, jax.random.key(0))
        assert jax.tree.structure(params) == jax.tree.structure(tiny_params)
        # Same initialisers and names: a checkpoint from one mode loads in any other.
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(tiny_params)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_fast_f32_matches_plain_loss_and_gradients(setup):
    config, params, tokens, (loss, grads) = setup
    fast_loss, fast_grads = _loss_and_grads(
        dataclasses.replace(config, matmul="fast_f32"), params, tokens)
    np.testing.assert_allclose(fast_loss, loss, rtol=1e-6)
    for g, f in zip(jax.tree.leaves(grads), jax.tree.leaves(fast_grads)):
        np.testing.assert_allclose(f, g, rtol=1e-4, atol=1e-6)


def test_fast_bf16_is_close_to_float32(setup):
    config, params, tokens, (loss, grads) = setup
    bf_loss, bf_grads = _loss_and_grads(
        dataclasses.replace(config, matmul="fast_bf16"), params, tokens)
    assert abs(float(bf_loss) - float(loss)) < 1e-2 * float(loss)
    total = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))))
    for g, b in zip(jax.tree.leaves(grads), jax.tree.leaves(bf_grads)):
        assert b.dtype == jnp.float32  # float32 params get float32 gradients
        # bfloat16 keeps 8 bits of mantissa: each gradient within a few percent in norm
        # (gradients that are zero in exact arithmetic, like the key bias's, get rounding noise).
        assert float(jnp.linalg.norm(b - g)) <= 0.05 * float(jnp.linalg.norm(g)) + 1e-4 * total


def test_matmul_custom_backward_equals_autodiff():
    x = jax.random.normal(jax.random.key(0), (3, 5, 7))
    w = jax.random.normal(jax.random.key(1), (7, 4))
    f = lambda x, w: jnp.sum(jnp.sin(fastdense.matmul(x, w, "float32")))  # noqa: E731
    ref = lambda x, w: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    for got, want in zip(jax.grad(f, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["fast_f32", "fast_bf16"])
def test_cached_decoding_matches_the_full_forward_in_fast_modes(setup, mode):
    config, params, tokens, _ = setup
    config = dataclasses.replace(config, matmul=mode)
    full_BTV = GPT(config).apply({"params": params}, tokens[:, :9])
    cache = decode.new_cache(config=config, batch=2)
    start_B = jnp.zeros((2,), jnp.int32)
    prefill_BTV, cache = decode._forward(config, params, tokens[:, :8], cache, 0, start_B)
    step_B1V, _ = decode._forward(config, params, tokens[:, 8:9], cache, 8, start_B)
    tol = 1e-4 if mode == "fast_f32" else 3e-2
    np.testing.assert_allclose(prefill_BTV, full_BTV[:, :8], atol=tol)
    np.testing.assert_allclose(step_B1V[:, 0], full_BTV[:, 8], atol=tol)


def test_unknown_matmul_mode_is_refused():
    config = base_config()
    config.model.matmul = "fast"
    with pytest.raises(ConfigError, match="model.matmul"):
        validate(config)


def test_model_config_carries_the_mode():
    config = base_config()
    config.model.matmul = "fast_bf16"
    assert ModelConfig.from_config(config).matmul == "fast_bf16"


@pytest.mark.parametrize("T,window,G", [(64, 0, 4), (64, 5, 4), (128, 0, 4), (64, 0, 2), (16, 0, 4)])
def test_fast_attention_and_its_backward_equal_the_reference(tiny_config, T, window, G):
    """The hand-written attention (upper triangle skipped from T = 64, a custom backward)
    against autodiff through the reference einsums, with windows and grouped K/V heads."""
    B, H, K = 2, 4, 8
    q = jax.random.normal(jax.random.key(0), (B, H, T, K))
    k, v = (jax.random.normal(jax.random.key(i), (B, G, T, K)) for i in (1, 2))
    config = dataclasses.replace(tiny_config, matmul="fast_f32")

    def fast(q, k, v):
        return jnp.sum(jnp.sin(fastdense.causal_attention(config, q, k, v, window)))

    def reference(q, k, v):
        mask = attention.causal_mask(T, window)
        return jnp.sum(jnp.sin(attention.dot_product_attention(q, k, v, mask)[0]))

    np.testing.assert_allclose(jax.jit(fast)(q, k, v), reference(q, k, v), rtol=1e-5)
    got, want = jax.jit(jax.grad(fast, (0, 1, 2)))(q, k, v), jax.grad(reference, (0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)

"""attention.py: the masks follow their formulas, the arithmetic is softmax(QKᵀ/√d)V, the
causal split and the kernels change nothing, and the CPU fast path's hand-written backward
equals autodiff through the same forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import attention
from transformer.model.kernels import attention_vjp


def _qkv(B, H, G, T, S, K, seed=0):
    q = jax.random.normal(jax.random.key(seed), (B, H, T, K))
    k, v = (jax.random.normal(jax.random.key(seed + i), (B, G, S, K)) for i in (1, 2))
    return q, k, v


def _numpy_attention(q, k, v, mask):
    """softmax(q kᵀ / √d) v per head in float64, query head h reading K/V head h // R."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    R = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, R, axis=1), np.repeat(v, R, axis=1)
    scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhts,bhsk->bhtk", w, v), w


# --- masks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("T,w", [(7, 0), (7, 3), (9, 1), (5, 10)])
def test_causal_mask_is_the_formula(T, w):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = (j <= i) & ((i - j < w) if w else True)
    mask = attention.causal_mask(T, w)
    assert mask.shape == (1, 1, T, T)
    np.testing.assert_array_equal(mask[0, 0], visible)


def test_window_masks_follow_the_formula():
    w, T_ = 3, 7
    i, j = np.arange(T_)[:, None], np.arange(T_)[None, :]
    np.testing.assert_array_equal(attention.causal_mask(T_, w)[0, 0], (j <= i) & (i - j < w))
    # the cached mask for the same tokens (no padding, all in one prefill) is the same
    cached = attention.cache_mask(jnp.zeros(1, jnp.int32), 0, T_, T_, w)[0, 0]
    np.testing.assert_array_equal(cached, (j <= i) & (i - j < w))


@pytest.mark.parametrize("window", [0, 2])
def test_cache_mask_hides_padding_future_and_the_window(window):
    """Row b's real tokens start at slot start[b]; the T new queries sit at slots index.."""
    start_B, index, T, S = np.array([0, 3, 5]), 5, 2, 9
    mask = np.asarray(attention.cache_mask(jnp.asarray(start_B), index, T, S, window))
    assert mask.shape == (3, 1, T, S)
    for b, start in enumerate(start_B):
        for t in range(T):
            query_slot = index + t
            for j in range(S):
                want = start <= j <= query_slot and (not window or query_slot - j < window)
                assert mask[b, 0, t, j] == want, (b, t, j)


# --- the arithmetic --------------------------------------------------------------------------

def test_n_kv_heads_equal_to_n_heads_is_plain_multi_head_attention():
    """The grouped einsum with G = H gives exactly softmax(q_h k_h^T / sqrt(K)) v_h per head."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 4, 6, 8)) for i in range(3))
    mask = attention.causal_mask(6)
    out, weights = attention.dot_product_attention(q, k, v, mask)
    scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(8)
    scores = np.where(mask, scores, -np.inf)
    expected_w = np.exp(scores - scores.max(-1, keepdims=True))
    expected_w /= expected_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected_w, atol=1e-6)
    np.testing.assert_allclose(out, np.einsum("bhts,bhsk->bhtk", expected_w, v), atol=1e-5)


@pytest.mark.parametrize("G", [4, 2, 1])
def test_grouped_heads_read_their_groups_key_value_head(G):
    q, k, v = _qkv(2, 4, G, 5, 9, 8)
    mask = attention.cache_mask(jnp.array([0, 2]), 4, 5, 9)
    out, weights = attention.dot_product_attention(q, k, v, mask)
    ref_out, ref_w = _numpy_attention(q, k, v, np.asarray(mask))
    np.testing.assert_allclose(weights, ref_w, atol=1e-6)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)


def test_bfloat16_compute_rounds_the_matmul_inputs_and_accumulates_in_float32():
    """compute_dtype=bfloat16 is the float32 arithmetic on bf16-rounded Q, K, V (and weights
    for the second product): nothing else is rounded, and the weights stay float32."""
    q, k, v = _qkv(1, 4, 2, 16, 16, 8)
    mask = attention.causal_mask(16)
    out, weights = attention.dot_product_attention(q, k, v, mask, "bfloat16")
    assert out.dtype == weights.dtype == jnp.float32
    r = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    _, ref_w = attention.dot_product_attention(r(q), r(k), r(v), mask)
    np.testing.assert_allclose(weights, ref_w, atol=1e-6)
    ref_out = jnp.einsum("bgrts,bgsk->bgrtk", r(ref_w).reshape(1, 2, 2, 16, 16), r(v))
    np.testing.assert_allclose(out, ref_out.reshape(out.shape), atol=1e-5)
    # and it is not the float32 result: the rounding is really there
    assert np.abs(out - attention.dot_product_attention(q, k, v, mask)[0]).max() > 1e-4


@pytest.mark.parametrize("T,window,G", [(64, 0, 4), (64, 7, 2), (65, 0, 4), (16, 0, 1)])
def test_causal_attention_skipping_the_upper_triangle_changes_nothing(T, window, G):
    """Query blocks that attend only to the keys they can see give the full computation's
    output and weights (zeros above the diagonal), split (T = 64) or not (odd, short T)."""
    q = jax.random.normal(jax.random.key(0), (2, 4, T, 8))
    k, v = (jax.random.normal(jax.random.key(i), (2, G, T, 8)) for i in (1, 2))
    mask = attention.causal_mask(T, window)
    assert len(attention.causal_blocks(T)) == (2 if T == 64 else 1)
    out, weights = attention.causal_attention(q, k, v, mask)
    ref_out, ref_weights = attention.dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-6)


@pytest.mark.parametrize("G", [4, 2, 1])
def test_kernels_agree(G):
    """einsum and jax.nn.dot_product_attention: causal, windowed, and a padded cache."""
    q = jax.random.normal(jax.random.key(0), (2, 4, 5, 8))
    k, v = (jax.random.normal(jax.random.key(i), (2, G, 9, 8)) for i in (1, 2))
    masks = [attention.causal_mask(9, 3)[:, :, 4:],
             attention.cache_mask(jnp.array([0, 2]), 4, 5, 9),
             attention.cache_mask(jnp.array([0, 2]), 4, 5, 9, window=2)]
    for mask in masks:
        ref, _ = attention.dot_product_attention(q, k, v, mask)
        np.testing.assert_allclose(attention.jax_attention(q, k, v, mask), ref, atol=1e-5)


# --- the hand-written backward (kernels/attention_vjp.py) ------------------------------------

def _fast(compute_dtype):
    attend = functools.partial(attention_vjp.dot_product_attention, compute_dtype=compute_dtype)
    return functools.partial(attention.causal_attention, attend=attend)


@pytest.mark.parametrize("T,window,G", [(64, 0, 4), (64, 5, 4), (128, 0, 4), (64, 0, 2), (16, 0, 4)])
def test_fast_attention_and_its_backward_equal_the_reference(T, window, G):
    """The hand-written attention (upper triangle skipped from T = 64, a custom backward)
    against autodiff through the reference einsums, with windows and grouped K/V heads."""
    B, H, K = 2, 4, 8
    q = jax.random.normal(jax.random.key(0), (B, H, T, K))
    k, v = (jax.random.normal(jax.random.key(i), (B, G, T, K)) for i in (1, 2))
    mask = attention.causal_mask(T, window)

    def fast(q, k, v):
        return jnp.sum(jnp.sin(_fast("float32")(q, k, v, mask)[0]))

    def reference(q, k, v):
        return jnp.sum(jnp.sin(attention.dot_product_attention(q, k, v, mask)[0]))

    np.testing.assert_allclose(jax.jit(fast)(q, k, v), reference(q, k, v), rtol=1e-5)
    got, want = jax.jit(jax.grad(fast, (0, 1, 2)))(q, k, v), jax.grad(reference, (0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_fast_attention_returns_the_references_weights():
    """The weights are the custom forward's second output (what the model sows on the fast
    path): the reference's weights, zeros above the diagonal and outside the window."""
    q, k, v = _qkv(2, 4, 2, 64, 64, 8)
    mask = attention.causal_mask(64, 9)
    out, weights = jax.jit(_fast("float32"))(q, k, v, mask)
    ref_out, ref_weights = attention.dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-6)


def test_fast_bfloat16_backward_is_close_to_float32_autodiff():
    """bf16 inputs keep 8 bits of mantissa: the gradients agree within a few percent in norm."""
    q, k, v = _qkv(2, 4, 2, 64, 64, 8)
    mask = attention.causal_mask(64)

    def fast(q, k, v):
        return jnp.sum(jnp.sin(_fast("bfloat16")(q, k, v, mask)[0]))

    def reference(q, k, v):
        return jnp.sum(jnp.sin(attention.dot_product_attention(q, k, v, mask)[0]))

    np.testing.assert_allclose(jax.jit(fast)(q, k, v), reference(q, k, v), rtol=2e-2)
    got, want = jax.jit(jax.grad(fast, (0, 1, 2)))(q, k, v), jax.grad(reference, (0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        assert g.dtype == jnp.float32
        assert float(jnp.linalg.norm(g - w)) <= 0.03 * float(jnp.linalg.norm(w))

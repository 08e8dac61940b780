"""Properties of the forward pass: causality, scan == unrolled, deterministic init."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model.gpt import GPT, count_params, init_params, stack_layers, unstack_layers


def _logits(config, params, tokens):
    return GPT(config).apply({"params": params}, tokens)


def test_logits_shape_and_dtype(tiny_config, tiny_params):
    tokens = jnp.zeros((3, 10), jnp.int32)
    logits = _logits(tiny_config, tiny_params, tokens)
    assert logits.shape == (3, 10, tiny_config.vocab_size)
    assert logits.dtype == jnp.float32


@pytest.mark.device
@pytest.mark.parametrize("t", [0, 5, 11])
def test_future_tokens_do_not_change_past_logits(tiny_config, tiny_params, t):
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, tiny_config.vocab_size)
    changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 7) % tiny_config.vocab_size)
    before = _logits(tiny_config, tiny_params, tokens)
    after = _logits(tiny_config, tiny_params, changed)
    np.testing.assert_array_equal(before[:, : t + 1], after[:, : t + 1])
    assert not np.allclose(before[:, t + 1:], after[:, t + 1:])  # the change did reach later logits


def test_gradient_of_logit_t_wrt_later_positions_is_zero(tiny_config, tiny_params):
    """pos_embed[s] enters only position s: d logits[t] / d pos_embed[s] must vanish for s > t."""
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, tiny_config.vocab_size)
    probe = jax.random.normal(jax.random.key(3), (tiny_config.vocab_size,))
    t = 6

    def logit_t(pos_embed):
        params = {**tiny_params, "pos_embed": pos_embed}
        return jnp.sum(_logits(tiny_config, params, tokens)[:, t] @ probe)

    grad = jax.jit(jax.grad(logit_t))(tiny_params["pos_embed"])  # as training's step runs it
    assert np.all(grad[t + 1:] == 0.0)
    assert np.all(np.abs(grad[: t + 1]).sum(axis=-1) > 0)  # earlier positions do matter


@pytest.mark.parametrize("remat", ["none", "block", "dots"])
def test_scan_layers_equals_unrolled(tiny_config, tiny_params, remat):
    tokens = jax.random.randint(jax.random.key(4), (2, 16), 0, tiny_config.vocab_size)
    scanned = dataclasses.replace(tiny_config, scan_layers=True, remat=remat)
    stacked = stack_layers(tiny_params, tiny_config.n_layers)
    assert stacked["blocks"]["attn"]["query"]["kernel"].shape[0] == tiny_config.n_layers
    np.testing.assert_allclose(_logits(scanned, stacked, tokens),
                               _logits(tiny_config, tiny_params, tokens), atol=1e-5, rtol=1e-5)
    # and the gradients agree too (remat must only change what is stored, not what is computed)
    loss = lambda cfg, p: jnp.mean(_logits(cfg, p, tokens) ** 2)  # noqa: E731
    # jitted, as the step runs them (eagerly, every op of the backward was a program)
    g_scan = unstack_layers(jax.jit(jax.grad(lambda p: loss(scanned, p)))(stacked),
                            tiny_config.n_layers)
    g_unrolled = jax.jit(jax.grad(lambda p: loss(tiny_config, p)))(tiny_params)
    for a, b in zip(jax.tree.leaves(g_scan), jax.tree.leaves(g_unrolled)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_scan_init_has_same_shapes_as_stacked_unrolled(tiny_config, tiny_params):
    scanned = dataclasses.replace(tiny_config, scan_layers=True)
    shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)  # noqa: E731
    assert shapes(init_params(scanned, jax.random.key(0))) == shapes(
        stack_layers(tiny_params, tiny_config.n_layers))


def test_init_is_deterministic_for_a_seed(tiny_config):
    a, b = init_params(tiny_config, jax.random.key(7)), init_params(tiny_config, jax.random.key(7))
    c = init_params(tiny_config, jax.random.key(8))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a["embed"]["embedding"], c["embed"]["embedding"])


def test_untied_head_adds_exactly_one_matrix(tiny_config, tiny_params):
    untied = init_params(dataclasses.replace(tiny_config, tie_embeddings=False), jax.random.key(0))
    extra = count_params(untied) - count_params(tiny_params)
    assert extra == tiny_config.d_model * tiny_config.vocab_size
    assert untied["head"]["kernel"].shape == (tiny_config.d_model, tiny_config.vocab_size)


@pytest.mark.device
def test_bfloat16_compute_keeps_float32_logits(tiny_config, tiny_params):
    bf16 = dataclasses.replace(tiny_config, dtype="bfloat16")
    tokens = jax.random.randint(jax.random.key(5), (2, 16), 0, tiny_config.vocab_size)
    logits = _logits(bf16, tiny_params, tokens)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, _logits(tiny_config, tiny_params, tokens), atol=0.1)


@pytest.mark.parametrize("tied", [True, False])
def test_bfloat16_logits_are_summed_in_float32(tiny_config, tied):
    """With model.dtype=bfloat16 the head multiplies bfloat16 inputs, but its sums are float32
    and so are the logits: they equal a float64 product of the same bfloat16-rounded inputs
    far below bfloat16's spacing (2^-8 relative: what a head that returned bfloat16 rounds
    to before the cast; it misses this tolerance by ~30x)."""
    config = dataclasses.replace(tiny_config, dtype="bfloat16", tie_embeddings=tied)
    params = init_params(config, jax.random.key(3))
    params = jax.tree.map(lambda x: x * 8, params)  # logits of a few units, not ~0.01
    tokens = jax.random.randint(jax.random.key(5), (2, 16), 0, config.vocab_size)
    logits, seen = GPT(config).apply({"params": params}, tokens, capture_intermediates=True,
                                     mutable=["intermediates"])
    h_BTD = seen["intermediates"]["ln_final"]["__call__"][0]  # the head's input (it rounds)
    w_DV = params["embed"]["embedding"].T if tied else params["head"]["kernel"]
    as64 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)  # noqa: E731
    reference = np.einsum("btd,dv->btv", as64(h_BTD), as64(w_DV))
    assert logits.dtype == jnp.float32
    scale = np.abs(reference).max()
    assert scale > 1.0
    np.testing.assert_allclose(np.asarray(logits, np.float64), reference,
                               atol=scale * 2.0 ** -8 / 30)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_bfloat16_activations_stay_bfloat16_through_every_norm(tiny_config, norm):
    """model.dtype=bfloat16 is the dtype of every activation between layers: a norm's output
    (its statistics are float32) included. Left to flax's promotion a bfloat16 input with a
    float32 gain came out float32: a post-norm block then handed the next one a float32
    residual stream, which nn.scan refuses (its carry changed dtype), and QK-norm's float32
    queries and keys beside bfloat16 values ran attention in float32 (einsum) or failed
    (jax.nn.dot_product_attention, hence cuDNN)."""
    config = dataclasses.replace(tiny_config, dtype="bfloat16", norm=norm,
                                 norm_placement="post", scan_layers=True, qk_norm=True,
                                 position="rope")
    tokens = jnp.zeros((1, 8), jnp.int32)
    for kernel in ("einsum", "jax"):  # traced only (eval_shape): dtypes need no compile
        c = dataclasses.replace(config, attention_kernel=kernel)
        params = jax.eval_shape(lambda key, c=c: init_params(c, key), jax.random.key(0))
        logits, seen = jax.eval_shape(
            lambda p, c=c: GPT(c).apply({"params": p}, tokens, mutable=["intermediates"]), params)
        assert logits.dtype == jnp.float32
        attn = seen["intermediates"]["blocks"]["attn"]
        dtypes = {attn[k][0].dtype for k in ("queries", "keys", "values")}
        assert dtypes == {jnp.dtype(jnp.bfloat16)}


def test_gpt2_initialisation_scales():
    """GPT-2's initialisation (Radford et al. 2019; nanoGPT): N(0, 0.02) for the token
    embedding, the head and every projection into the residual stream's reading side;
    N(0, 0.01) for learned positions; N(0, 0.02/√(2L)) for the two projections that write
    into the residual stream (attention out, MLP project); biases 0, norm gains 1. Sample
    standard deviations of 8k-200k draws sit within 3% of these."""
    from transformer.model.gpt import ModelConfig
    L = 4
    config = ModelConfig(vocab_size=512, d_model=128, n_layers=L, n_heads=4, d_ff=512,
                         max_seq_len=64, matmul="plain", tie_embeddings=False)
    params = init_params(config, jax.random.key(0))
    residual = 0.02 / (2 * L) ** 0.5
    expected = {"embed": 0.02, "pos_embed": 0.01, "head": 0.02, "query": 0.02, "key": 0.02,
                "value": 0.02, "expand": 0.02, "out": residual, "project": residual}
    seen = set()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        names = [str(getattr(p, "key", p)) for p in path]
        x = np.asarray(leaf, np.float64)
        if names[-1] == "bias":
            assert np.all(x == 0), names
        elif names[-1] == "scale":
            assert np.all(x == 1), names
        else:
            owner = names[-2] if names[-1] in ("kernel", "embedding") else names[-1]
            std = expected[owner]
            assert abs(x.mean()) < 0.05 * std and x.std() == pytest.approx(std, rel=0.03), names
            seen.add(owner)
    assert seen == set(expected)

"""The kernel seam (transformer/model/kernels/): every matmul mode gives the plain path's numbers and
parameters, every attention path that forms weights sows them, and the model and decoder
never look at how the matmuls are computed."""

import ast
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.generate import decode, step
from transformer.model import kernels
from transformer.model.gpt import GPT, init_params
from transformer.model.kernels import dense
from transformer.train import step as step_lib
from transformer.train import trainer as training


def _loss_and_grads(config, params, tokens):
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
             "weights": jnp.ones(tokens[:, 1:].shape, jnp.float32)}
    return jax.jit(jax.value_and_grad(step_lib.loss_fn), static_argnums=2)(params, batch, config)


@pytest.fixture(scope="module")
def setup(tiny_config, tiny_params):
    tokens = jax.random.randint(jax.random.key(1), (2, 33), 0, tiny_config.vocab_size)
    return tiny_config, tiny_params, tokens, _loss_and_grads(tiny_config, tiny_params, tokens)


def test_every_mode_has_the_same_parameters(tiny_config, tiny_params):
    for mode in kernels.MODES:
        config = dataclasses.replace(tiny_config, matmul=mode)
        params = init_params(config, jax.random.key(0))
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
    f = lambda x, w: jnp.sum(jnp.sin(dense.matmul(x, w, "float32")))  # noqa: E731
    ref = lambda x, w: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    for got, want in zip(jax.grad(f, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d_model", [63, 64])
def test_the_tied_head_trains_in_bf16_at_an_odd_width(d_model):
    """The tied head multiplies by the embedding transposed (dense.transposed). At an odd
    d_model that was a plain `.T`, which XLA-CPU folds into a bfloat16 dot its DotThunk cannot
    run ("Unsupported element type ... BF16 x BF16 = F32"): `train.py --config.model.n_heads=3
    --config.model.d_model=63`, the fix the d_model error suggested, crashed at its first step."""
    x = jax.random.normal(jax.random.key(0), (2, 8, d_model))
    w = jax.random.normal(jax.random.key(1), (257, d_model))  # [V, D] as the embedding
    f = lambda x, w: jnp.sum(dense.matmul(x, dense.transposed(w), "bfloat16") ** 2)  # noqa: E731
    bf = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    ref = lambda x, w: jnp.sum((bf(x) @ bf(w).T) ** 2)  # noqa: E731
    got = jax.jit(jax.grad(f, (0, 1)))(x, w)
    for g, r in zip(got, jax.grad(ref, (0, 1))(x, w)):
        assert float(jnp.linalg.norm(g - r)) <= 0.02 * float(jnp.linalg.norm(r))


@pytest.mark.parametrize("mode", ["fast_f32", "fast_bf16"])
def test_cached_decoding_matches_the_full_forward_in_fast_modes(setup, mode):
    config, params, tokens, _ = setup
    config = dataclasses.replace(config, matmul=mode)
    # jitted, as the decode program runs them (eagerly each op was a program of its own)
    full_BTV = jax.jit(lambda p, t: GPT(config).apply({"params": p}, t))(params, tokens[:, :9])
    cache = decode.new_cache(config=config, batch=2)
    start_B = jnp.zeros((2,), jnp.int32)
    forward = jax.jit(step.forward, static_argnums=0)
    prefill_BTV, cache = forward(config, params, tokens[:, :8], cache, 0, start_B)
    step_B1V, _ = forward(config, params, tokens[:, 8:9], cache, 8, start_B)
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


@pytest.mark.parametrize("mode", ["plain", "fast_f32", "fast_bf16"])
def test_every_einsum_path_sows_the_attention_weights(setup, mode):
    """Training-shaped (T = 64: two causal blocks) and cached forward passes both sow weights:
    rows sum to one, zero on future keys, and within bf16 rounding of the plain path's."""
    config, params, tokens, _ = setup
    config = dataclasses.replace(config, matmul=mode)
    long_BT = jax.random.randint(jax.random.key(2), (2, 64), 0, config.vocab_size)

    def sown_weights(config):
        _, state = GPT(config).apply({"params": params}, long_BT,
                                     mutable=["intermediates"])
        return np.stack([state["intermediates"][f"block_{i}"]["attn"]["attention_weights"][0]
                         for i in range(config.n_layers)])

    weights_LBHTT = sown_weights(config)
    np.testing.assert_allclose(weights_LBHTT.sum(-1), 1.0, atol=1e-5)
    assert not np.triu(weights_LBHTT, k=1).any()
    plain = sown_weights(dataclasses.replace(config, matmul="plain"))
    np.testing.assert_allclose(weights_LBHTT, plain, atol=1e-6 if mode != "fast_bf16" else 2e-2)
    cache = decode.new_cache(config=config, batch=2)
    _, state = jax.jit(lambda p, c: GPT(config).apply(
        {"params": p}, tokens[:, :8], cache=c, index=0, start_B=jnp.zeros((2,), jnp.int32),
        mutable=["intermediates"]))(params, cache)
    assert state["intermediates"]["block_0"]["attn"]["attention_weights"][0].shape == (
        2, config.n_heads, 8, config.max_seq_len)


def test_the_jax_kernel_sows_no_weights_and_forming_weights_picks_einsum(setup):
    config, params, tokens, _ = setup
    jax_kernel = dataclasses.replace(config, attention_kernel="jax")
    _, state = GPT(jax_kernel).apply({"params": params}, tokens[:, :8],
                                     mutable=["intermediates"])
    assert "attention_weights" not in state["intermediates"]["block_0"]["attn"]
    assert kernels.forming_weights(jax_kernel).attention_kernel == "einsum"
    assert kernels.forming_weights(config) == config


def test_decode_setup_casts_kernels_and_keeps_the_mode_for_every_batch(tiny_config,
                                                                       tiny_params):
    """One row decodes in the mode of eight (it used to switch to fast_f32: another
    precision, so sample 0 depended on how many samples were asked for)."""
    config = dataclasses.replace(tiny_config, matmul="fast_bf16")
    for batch in (1, 8):
        same, params_b = kernels.decode_setup(config, tiny_params, batch)
        assert same.matmul == "fast_bf16" and kernels.decode_matmul(config, batch) == "fast_bf16"
        for path, x in jax.tree_util.tree_leaves_with_path(params_b):
            is_kernel = getattr(path[-1], "key", None) == "kernel"
            assert x.dtype == (jnp.bfloat16 if is_kernel else jnp.float32), path
    for mode in ("plain", "fast_f32"):
        same = dataclasses.replace(tiny_config, matmul=mode)
        assert kernels.decode_setup(same, tiny_params, 8) == (same, tiny_params)


def test_compute_dtype_and_train_settings_name_the_precision():
    c = ModelConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, d_ff=8, max_seq_len=8,
                    matmul="plain")
    assert kernels.compute_dtype(c) == "float32"
    assert kernels.compute_dtype(dataclasses.replace(c, matmul="fast_bf16")) == "bfloat16"
    assert kernels.compute_dtype(dataclasses.replace(c, dtype="bfloat16")) == "bfloat16"
    for platform in ("cpu", "gpu"):
        for precision in ("float32", "bfloat16"):
            settings = kernels.train_settings(precision, platform)
            assert kernels.compute_dtype(dataclasses.replace(c, **settings)) == precision
            assert settings["matmul"] in kernels.MODES


@pytest.mark.parametrize("name", ["model/gpt.py", "generate/decode.py"])
def test_model_and_decoder_leave_the_matmuls_to_the_seam(name):
    """They neither read model.matmul / attention_kernel nor import the fast path's modules."""
    tree = ast.parse((Path(training.__file__).parents[1] / name).read_text())
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not read & {"matmul", "attention_kernel"}
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                            if isinstance(node, ast.ImportFrom)}
    assert not imported & {"dense", "attention_vjp", "transformer.model.kernels"}


@pytest.mark.parametrize("window", [0, 5])
def test_the_jax_kernel_trains_with_is_causal_not_a_dense_mask(window, monkeypatch):
    """attention_kernel=jax (and cudnn, the same call with cuDNN) is told the mask is causal,
    with the sliding window as local_window_size, instead of given a [B, H, T, T] mask (which
    cuDNN turns into a bias it reads through its slower kernel); the logits still equal the
    einsum reference's."""
    calls = []
    real = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    config = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                         max_seq_len=16, matmul="plain", attention_kernel="jax",
                         sliding_window=window)
    params = init_params(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 64)
    calls.clear()  # init's
    logits = GPT(config).apply({"params": params}, tokens)
    assert len(calls) == 2  # one per layer
    for kwargs in calls:
        assert kwargs.get("mask") is None and kwargs.get("bias") is None and kwargs["is_causal"]
        assert kwargs["local_window_size"] == ((window - 1, 0) if window else None)
    reference = GPT(dataclasses.replace(config, attention_kernel="einsum")).apply(
        {"params": params}, tokens)
    np.testing.assert_allclose(logits, reference, atol=1e-5)


@pytest.mark.parametrize("tie", [True, False])
def test_the_head_runs_in_the_modes_precision(tiny_config, tie):
    """The logits' matmul, tied or untied, follows the mode like every other dense layer:
    fast_bf16 multiplies bfloat16 inputs into float32 logits (the step's largest matmul at a
    few thousand tokens of vocabulary; it ran in float32 before, 12% of the quick start's
    step). That fast_f32 gives plain's numbers with either head is test_fast_f32_matches_plain
    (tied) and test_variants' modern pieces (untied)."""
    config = dataclasses.replace(tiny_config, tie_embeddings=tie)
    params = init_params(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 33), 0, config.vocab_size)
    bf16 = dataclasses.replace(config, matmul="fast_bf16")
    jaxpr = jax.make_jaxpr(lambda p: GPT(bf16).apply({"params": p}, tokens[:, :-1]))(params)
    heads = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"
             and e.outvars[0].aval.shape[-1] == config.vocab_size]
    assert heads, "no matmul produces the logits"
    for e in heads:
        assert [v.aval.dtype for v in e.invars] == [jnp.bfloat16, jnp.bfloat16]
        assert e.outvars[0].aval.dtype == jnp.float32  # summed in float32: logits not rounded


def _equations(jaxpr):
    """Every equation of a jaxpr, into custom_vjp and pjit bodies."""
    for e in jaxpr.eqns:
        yield e
        for value in e.params.values():
            inner = getattr(value, "jaxpr", None)
            if inner is not None:
                yield from _equations(getattr(inner, "jaxpr", inner))

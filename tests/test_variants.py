"""Every architecture variant keeps the model's contracts: causal, cached decoding equal to
the full pass, nn.scan equal to unrolled, and it still learns the copy task.

The variants are a representative set, not the full product: together they use every value
of every switch (position, norm, placement, MLP, K/V heads, window, kernel) at least once.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.data import batches
from transformer.generate import decode
from transformer.generate import step as decode_step
from transformer.model.gpt import GPT, init_params, stack_layers
from transformer.train import step as step_lib
from transformer.train import trainer as training

V, T = 16, 16
SMALL = ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=T,
                    matmul="plain")  # float32 reference arithmetic: the 1e-5 checks below

VARIANTS = {
    "default": {},
    "rope-rms-swiglu-gqa": dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_heads=2),
    "post-relu-mqa-window": dict(norm_placement="post", mlp="relu", n_kv_heads=1,
                                 sliding_window=10),
    "rope-post-window-jax": dict(position="rope", norm_placement="post", sliding_window=10,
                                 attention_kernel="jax"),
    "rms-swiglu-mqa-jax": dict(norm="rmsnorm", mlp="swiglu", n_kv_heads=1,
                               attention_kernel="jax"),
    # The modern recipe's pieces (issue 29): QK-norm, ReLU², no biases, soft-capped logits,
    # an untied head; and QK-norm with learned positions and a bias-free LayerNorm.
    "rope-qknorm-relu2-nobias-softcap-untied": dict(
        position="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, bias=False,
        logit_softcap=3.0, tie_embeddings=False, n_kv_heads=2),
    "learned-qknorm-nobias-layernorm-softcap-window": dict(
        qk_norm=True, bias=False, logit_softcap=3.0, sliding_window=10),
}
# The new pieces, with zero-initialised outputs and padded ids too, for the kernel checks.
MODERN = dict(position="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, bias=False,
              logit_softcap=3.0, tie_embeddings=False, vocab_used=V - 3)
variant = pytest.mark.parametrize("name", list(VARIANTS))


def small(name, **kw):
    return dataclasses.replace(SMALL, **VARIANTS[name], **kw)


@functools.partial(jax.jit, static_argnums=0)
def forward(config, params, tokens_BT, positions_BT=None):
    return GPT(config).apply({"params": params}, tokens_BT, positions_BT)


cached_forward = jax.jit(decode_step.forward, static_argnums=0)  # index traced: two compiles


def tokens(B=2, length=T, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, length), 0, V)


def test_variants_cover_every_switch_value():
    seen = {f: {getattr(small(n), f) for n in VARIANTS} for f in
            ("position", "norm", "norm_placement", "mlp", "kv_heads", "attention_kernel",
             "qk_norm", "bias", "tie_embeddings")}
    assert seen["position"] == {"learned", "rope"}
    assert seen["norm"] == {"layernorm", "rmsnorm"}
    assert seen["norm_placement"] == {"pre", "post"}
    assert seen["mlp"] == {"relu", "gelu", "swiglu", "relu2"}
    assert seen["qk_norm"] == seen["bias"] == seen["tie_embeddings"] == {True, False}
    assert {small(n).logit_softcap > 0 for n in VARIANTS} == {True, False}
    assert seen["kv_heads"] == {4, 2, 1}
    assert seen["attention_kernel"] == {"einsum", "jax"}
    assert {small(n).sliding_window > 0 for n in VARIANTS} == {True, False}


@variant
def test_causal(name):
    """Changing token t changes no logit before t (and does change logits from t on)."""
    config = small(name)
    params = init_params(config, jax.random.key(0))
    x_BT = tokens()
    t = 7
    y_BT = x_BT.at[:, t].set((x_BT[:, t] + 1) % V)
    a, b = forward(config, params, x_BT), forward(config, params, y_BT)
    np.testing.assert_array_equal(a[:, :t], b[:, :t])
    assert jnp.abs(a[:, t] - b[:, t]).max() > 1e-6


@variant
def test_cached_decoding_equals_full_forward(name):
    """Prefill then one token at a time, with a left-padded row, past the sliding window."""
    config = small(name)
    params = init_params(config, jax.random.key(0))
    x_BT, pad = tokens(), 3  # row 1 is left-padded: its positions start at its first real token
    padded_BT = x_BT.at[1].set(jnp.roll(x_BT[1], pad).at[:pad].set(0))
    start_B = jnp.array([0, pad], jnp.int32)
    cache = decode.new_cache(config=config, batch=2)
    P = 5
    logits, cache = cached_forward(config, params, padded_BT[:, :P], cache, 0, start_B)
    steps = [logits]
    for i in range(P, T):
        logits, cache = cached_forward(config, params, padded_BT[:, i:i + 1], cache, i, start_B)
        steps.append(logits)
    cached_BTV = jnp.concatenate(steps, axis=1)
    full_BTV = forward(config, params, x_BT)  # row 1's real tokens are x_BT[1, :T - pad]
    np.testing.assert_allclose(cached_BTV[0], full_BTV[0], atol=2e-5)
    np.testing.assert_allclose(cached_BTV[1, pad:], full_BTV[1, :T - pad], atol=2e-5)
    assert cache[0]["k"].shape == (2 * config.kv_heads, T, config.head_dim)


@variant
def test_scan_equals_unrolled(name):
    config = small(name)
    params = init_params(config, jax.random.key(0))
    scanned = dataclasses.replace(config, scan_layers=True)
    x_BT = tokens()
    np.testing.assert_allclose(forward(scanned, stack_layers(params, config.n_layers), x_BT),
                               forward(config, params, x_BT), atol=1e-5)


# Learning the copy task costs ~5 s of CPU a variant: the default run trains the base model
# and the default config's block (RoPE, RMSNorm, SwiGLU, here with grouped K/V); the other
# variants learn it with -m slow (each keeps causality, cache == full and scan == unrolled
# above in the default run).
COPY_TASK_DEFAULT_RUN = ("default", "rope-rms-swiglu-gqa")


@pytest.mark.parametrize("name", [n if n in COPY_TASK_DEFAULT_RUN else
                                  pytest.param(n, marks=pytest.mark.slow) for n in VARIANTS])
def test_learns_the_copy_task(name):
    """A model that must move information n positions back gets far below chance."""
    c = base_config()
    c.model.update(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=T,
                   **VARIANTS[name])
    steps, B = 200, 32
    c.train.update(steps=steps, batch_size=B, lr=1e-2, warmup_steps=10, weight_decay=0.0)
    c.sample.max_new_tokens = 8
    trainer = training.Trainer.build(validate(c))
    state = step_lib.init_state(trainer.model_config, trainer.optimizer, 0)
    source = batches.CopyTask(V, T)
    data = jax.tree.map(lambda *xs: np.stack(xs),
                        *[source.batch(0, "train", s, B) for s in range(steps)])
    step = functools.partial(step_lib.train_step, model_config=trainer.model_config,
                             optimizer=trainer.optimizer)
    state, _ = jax.jit(lambda s, d: jax.lax.scan(step, s, d))(state, data)  # one compile
    loss = float(trainer.eval_fn(state.params, source.batch(0, "val", 0, 64)))
    assert loss < 0.5 * math.log(V), f"copy loss {loss:.3f}, chance {math.log(V):.3f}"


# --- sliding window ---------------------------------------------------------------------

def test_window_hides_exactly_the_positions_outside_it():
    """One layer, window w: the logits at t depend on t-w+1 .. t and on nothing earlier."""
    w, t = 4, 12
    config = dataclasses.replace(SMALL, n_layers=1, sliding_window=w)
    params = init_params(config, jax.random.key(0))
    x_BT = tokens()
    base = forward(config, params, x_BT)[:, t]
    for s, visible in ((t - w - 1, False), (t - w, False), (t - w + 1, True)):
        changed = forward(config, params, x_BT.at[:, s].set((x_BT[:, s] + 1) % V))[:, t]
        assert (jnp.abs(changed - base).max() > 1e-6) == visible, (s, visible)


# --- grouped-query and multi-query attention ---------------------------------------------

def test_generation_cache_has_n_kv_heads_heads():
    n_kv_heads = 1
    config = dataclasses.replace(SMALL, n_kv_heads=n_kv_heads)
    params = init_params(config, jax.random.key(0))
    cache = decode.new_cache(config=config, batch=2)
    _, cache = decode.generate_tokens(
        params, cache, np.ones((2, 4), np.int32), np.zeros(2, np.int32), jax.random.key(0),
        jnp.float32(0), jnp.int32(0), jnp.float32(1), jnp.int32(-1), config=config,
        max_new_tokens=3)
    assert all(layer[k].shape == (2 * n_kv_heads, T, config.head_dim)
               for layer in cache for k in ("k", "v"))


def test_gqa_equals_multi_head_with_repeated_key_value_heads():
    """G K/V heads shared by groups of R query heads = H heads whose K/V weights repeat."""
    gqa = dataclasses.replace(SMALL, n_kv_heads=2)
    mha = dataclasses.replace(SMALL, n_kv_heads=4)
    params = init_params(gqa, jax.random.key(0))
    R = gqa.n_heads // gqa.kv_heads
    repeated = jax.tree.map(lambda x: x, params)
    for i in range(gqa.n_layers):
        attn = repeated[f"block_{i}"]["attn"]
        for proj in ("key", "value"):  # kernel [D, G, K] → [D, H, K], bias [G, K] → [H, K]
            attn[proj] = {"kernel": jnp.repeat(attn[proj]["kernel"], R, axis=1),
                          "bias": jnp.repeat(attn[proj]["bias"], R, axis=0)}
    x_BT = tokens()
    np.testing.assert_allclose(forward(gqa, params, x_BT), forward(mha, repeated, x_BT),
                               atol=1e-5)


def test_default_n_kv_heads_keeps_the_cache_at_n_heads():
    config = ModelConfig.from_config(base_config())
    assert config.kv_heads == config.n_heads and config.mlp_hidden == config.d_ff


# --- the two kernels ---------------------------------------------------------------------


@pytest.mark.device
def test_model_kernels_agree():
    config = dataclasses.replace(SMALL, position="rope", n_kv_heads=2, sliding_window=5)
    params = init_params(config, jax.random.key(0))
    x_BT = tokens()
    jax_kernel = dataclasses.replace(config, attention_kernel="jax")
    np.testing.assert_allclose(forward(jax_kernel, params, x_BT), forward(config, params, x_BT),
                               atol=1e-5)


# --- config ------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,words", [
    ("n_kv_heads", 3, "must divide model.n_heads=4"),
    ("n_kv_heads", -1, "must divide"),
    ("sliding_window", -2, ">= 0"),
    ("position", "alibi", "learned, rope"),
    ("mlp", "geglu", "relu, gelu, swiglu"),
    ("norm_placement", "sandwich", "pre, post"),
    ("attention_kernel", "flash", "einsum, jax"),
])
def test_bad_variant_values_name_the_field(field, value, words):
    c = base_config()
    c.model[field] = value
    with pytest.raises(ConfigError, match=f"model.{field}") as e:
        validate(c)
    assert words in str(e.value)


def test_rope_needs_an_even_head_dim():
    c = base_config()
    c.model.update(d_model=60, n_heads=4, position="rope")  # head dim 15
    with pytest.raises(ConfigError, match="model.position"):
        validate(c)


def test_swiglu_keeps_the_parameter_count_comparable():
    gelu = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4, d_ff=512,
                       max_seq_len=32)
    swiglu = dataclasses.replace(gelu, mlp="swiglu")
    shapes = [jax.eval_shape(functools.partial(init_params, c), jax.random.key(0))
              for c in (gelu, swiglu)]
    n = [sum(x.size for x in jax.tree.leaves(p["block_0"]["mlp"])) for p in shapes]
    assert swiglu.mlp_hidden % 8 == 0 and abs(n[1] - n[0]) / n[0] < 0.02


# --- the modern recipe's pieces ----------------------------------------------------------

def _perturbed(config, seed=0):
    """Init params with every leaf moved by noise (gains away from 1, zero kernels away from 0),
    so that a norm gain or a zero-initialised kernel that is misused cannot hide."""
    params = init_params(config, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.2 * jax.random.normal(k, x.shape) for x, k in
                                     zip(leaves, keys)])


def _loss_and_grads(config, params, x_BT, z_loss=0.0):
    batch = {"inputs": x_BT[:, :-1], "targets": x_BT[:, 1:],
             "weights": jnp.ones(x_BT[:, 1:].shape, jnp.float32)}
    return jax.jit(lambda p: step_lib.accumulated_grad(p, batch, config, 1, z_loss))(params)


def test_fast_kernels_give_the_plain_numbers_for_the_modern_pieces():
    """QK-norm, ReLU², no biases, soft-cap, untied head, padded ids: fast_f32 computes plain's
    loss and gradients (float32, up to summation order), fast_bf16 within bfloat16's rounding."""
    config = dataclasses.replace(SMALL, **MODERN)
    params = _perturbed(config)
    x_BT = tokens(length=T + 1) % (V - 3)
    loss, grads = _loss_and_grads(config, params, x_BT)
    fast_loss, fast_grads = _loss_and_grads(dataclasses.replace(config, matmul="fast_f32"),
                                            params, x_BT)
    np.testing.assert_allclose(fast_loss, loss, rtol=1e-6)
    for g, f in zip(jax.tree.leaves(grads), jax.tree.leaves(fast_grads)):
        np.testing.assert_allclose(f, g, rtol=1e-4, atol=1e-6)
    bf_loss, bf_grads = _loss_and_grads(dataclasses.replace(config, matmul="fast_bf16"),
                                        params, x_BT)
    assert abs(float(bf_loss) - float(loss)) < 1e-2 * float(loss)
    for g, b in zip(jax.tree.leaves(grads), jax.tree.leaves(bf_grads)):
        assert float(jnp.linalg.norm(b - g)) <= 0.05 * float(jnp.linalg.norm(g)) + 1e-5
    # Cached decoding in each mode, too. fast_bf16's full pass rounds attention's inputs to
    # bfloat16 and its cached pass does not (test_kernels.py): ~1% of the capped range of 3.
    for mode, atol in (("plain", 2e-5), ("fast_f32", 1e-4), ("fast_bf16", 6e-2)):
        _check_cache_equals_full(dataclasses.replace(config, matmul=mode), params, atol)


def _check_cache_equals_full(config, params, atol):
    x_BT = tokens()
    cache = decode.new_cache(config=config, batch=2)
    start_B = jnp.zeros(2, jnp.int32)
    logits, cache = cached_forward(config, params, x_BT[:, :5], cache, 0, start_B)
    steps = [logits]
    for i in range(5, T):
        logits, cache = cached_forward(config, params, x_BT[:, i:i + 1], cache, i, start_B)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), forward(config, params, x_BT),
                               atol=atol)


def test_qk_norm_makes_scores_blind_to_the_scale_of_q_and_k():
    """RMSNorm over each head's K dims: scaling W_Q and W_K (no biases) changes nothing; without
    QK-norm the same scaling does change the logits. Each head's q has rms = its gain."""
    config = dataclasses.replace(SMALL, qk_norm=True, bias=False, position="rope",
                                 norm="rmsnorm")
    params = _perturbed(config)

    def scaled(p, factor):
        p = jax.tree.map(lambda x: x, p)
        for i in range(config.n_layers):
            for proj in ("query", "key"):
                p[f"block_{i}"]["attn"][proj]["kernel"] = factor * p[f"block_{i}"]["attn"][proj][
                    "kernel"]
        return p
    x_BT = tokens()
    base = forward(config, params, x_BT)
    # (up to the epsilon inside the RMS: 1e-5 against mean squares of ~0.1 and ~5)
    np.testing.assert_allclose(forward(config, scaled(params, 7.0), x_BT), base, atol=2e-4)
    plain = dataclasses.replace(config, qk_norm=False)
    unnormed = {k: v for k, v in params.items()}
    for i in range(config.n_layers):
        unnormed[f"block_{i}"] = {**params[f"block_{i}"], "attn": {
            k: v for k, v in params[f"block_{i}"]["attn"].items() if k not in ("q_norm",
                                                                               "k_norm")}}
    assert jnp.abs(forward(plain, scaled(unnormed, 7.0), x_BT)
                   - forward(plain, unnormed, x_BT)).max() > 1e-3
    # With a uniform gain g every head's query has rms g (the rotation keeps the norm).
    uniform = jax.tree.map(lambda x: x, params)
    uniform["block_0"]["attn"]["q_norm"]["scale"] = jnp.full((config.head_dim,), 1.7)
    _, seen = GPT(config).apply({"params": uniform}, x_BT, mutable=["intermediates"])
    q_BHTK = seen["intermediates"]["block_0"]["attn"]["queries"][0]
    rms_BHT = jnp.sqrt(jnp.mean(jnp.square(q_BHTK), axis=-1))
    np.testing.assert_allclose(rms_BHT, 1.7, rtol=1e-3)


def test_relu2_is_relu_squared():
    """One MLP with ReLU² equals W_2 · max(x W_1 + b_1, 0)² + b_2 written out."""
    from transformer.model.gpt import MLP
    config = dataclasses.replace(SMALL, mlp="relu2")
    x_BTD = jax.random.normal(jax.random.key(3), (2, 5, config.d_model))
    mlp = MLP(config)
    p = _perturbed_tree(mlp.init(jax.random.key(0), x_BTD)["params"])
    e, pr = p["expand"], p["project"]
    want = np.square(np.maximum(x_BTD @ e["kernel"] + e["bias"], 0)) @ pr["kernel"] + pr["bias"]
    np.testing.assert_allclose(mlp.apply({"params": p}, x_BTD), want, atol=1e-5)


def _perturbed_tree(tree):
    tree = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, tree,
                        is_leaf=lambda x: hasattr(x, "unbox"))
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(9), len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.3 * jax.random.normal(k, x.shape)
                                        for x, k in zip(leaves, keys)])


def test_logit_softcap_is_c_tanh_of_the_uncapped_logits():
    """The cap is applied to the logits the head computes, c·tanh(z/c): every logit within
    [-c, c], in the uncapped logits' order, and equal to them pushed through the formula."""
    c = 2.0
    config = dataclasses.replace(SMALL, logit_softcap=c)
    params = jax.tree.map(lambda x: 10 * x, init_params(config, jax.random.key(0)))
    x_BT = tokens()
    uncapped = forward(dataclasses.replace(config, logit_softcap=0.0), params, x_BT)
    assert jnp.abs(uncapped).max() > 2 * c  # large enough for the cap to matter
    capped = forward(config, params, x_BT)
    np.testing.assert_allclose(capped, c * jnp.tanh(uncapped / c), atol=1e-5)
    # float32 tanh rounds to exactly ±1 past |z/c| ~ 9, so the bound is <= c, not < c; the
    # cap is monotone (ties only where it saturates), so no row's logits change order.
    assert jnp.abs(capped).max() <= c
    order = np.argsort(np.asarray(uncapped).reshape(-1, uncapped.shape[-1]), axis=-1)
    rows = np.take_along_axis(np.asarray(capped).reshape(order.shape), order, axis=-1)
    assert (np.diff(rows, axis=-1) >= 0).all()


def test_bias_false_leaves_no_bias_anywhere():
    for norm in ("layernorm", "rmsnorm"):
        config = dataclasses.replace(SMALL, bias=False, norm=norm, mlp="swiglu", qk_norm=True)
        names = {str(getattr(k, "key", k)) for path, _ in jax.tree_util.tree_leaves_with_path(
            init_params(config, jax.random.key(0))) for k in path}
        assert "bias" not in names and "scale" in names
    with_bias = {str(getattr(k, "key", k)) for path, _ in jax.tree_util.tree_leaves_with_path(
        init_params(SMALL, jax.random.key(0))) for k in path}
    assert "bias" in with_bias


def test_zero_init_out_starts_every_block_as_the_identity():
    """Attention-out and MLP-project kernels (and biases) start at exactly 0, so the initial
    logits are those of the model with no blocks, head(norm(embed(x) + pos)); the gradient
    still reaches those kernels, so they do not stay 0."""
    config = dataclasses.replace(SMALL, zero_init_out=True)
    params = init_params(config, jax.random.key(0))
    for i in range(config.n_layers):
        assert not np.asarray(params[f"block_{i}"]["attn"]["out"]["kernel"]).any()
        assert not np.asarray(params[f"block_{i}"]["mlp"]["project"]["kernel"]).any()
        assert np.asarray(params[f"block_{i}"]["attn"]["query"]["kernel"]).std() > 0.01
    x_BT = tokens()
    h_BTD = params["embed"]["embedding"][x_BT] + params["pos_embed"][jnp.arange(T)]
    mu = h_BTD.mean(-1, keepdims=True)
    var = ((h_BTD - mu) ** 2).mean(-1, keepdims=True)
    ln = params["ln_final"]
    h_BTD = (h_BTD - mu) / jnp.sqrt(var + 1e-5) * ln["scale"] + ln["bias"]
    np.testing.assert_allclose(forward(config, params, x_BT),
                               h_BTD @ params["embed"]["embedding"].T, atol=1e-5)
    _, grads = _loss_and_grads(config, params, tokens(length=T + 1))
    assert np.abs(grads["block_0"]["mlp"]["project"]["kernel"]).max() > 0
    default = init_params(SMALL, jax.random.key(0))
    assert np.asarray(default["block_0"]["attn"]["out"]["kernel"]).std() > 0


def test_z_loss_adds_z_logsumexp_squared_to_the_gradient_not_to_the_logged_loss():
    """train.z_loss: the loss reported is the cross-entropy whatever z is, and the gradient is
    that of CE + z·mean(logsumexp(logits)²), checked against autodiff of that formula."""
    config = SMALL
    params = _perturbed(config)
    x_BT = tokens(length=T + 1)
    z = 0.1
    ce0, g0 = _loss_and_grads(config, params, x_BT)
    ce, g = _loss_and_grads(config, params, x_BT, z_loss=z)
    np.testing.assert_allclose(ce, ce0, rtol=1e-6)

    def formula(p):
        logits = GPT(config).apply({"params": p}, x_BT[:, :-1])
        lse = jax.nn.logsumexp(logits, axis=-1)
        ce = jnp.mean(lse - jnp.take_along_axis(logits, x_BT[:, 1:, None], -1)[..., 0])
        return ce + z * jnp.mean(lse ** 2)
    want = jax.jit(jax.grad(formula))(params)  # one program, not each op eagerly
    for a, b, plain in zip(jax.tree.leaves(g), jax.tree.leaves(want), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g),
                                                           jax.tree.leaves(g0))) > 1e-4


# --- a padded vocabulary (model.vocab_multiple, model.vocab_used) ---------------------------

def test_vocab_zero_is_padded_to_the_multiple_and_to_the_mesh_once_at_the_start():
    """257 byte ids: kept as they are by default; 320 with vocab_multiple=64 (nanoGPT's rule);
    258 on mesh.tensor=2, which the mesh then accepts (it stopped the run at start-up); a
    resumed run keeps its checkpoint's vocabulary on any mesh; `sizes` pads the same way."""
    from types import SimpleNamespace

    from transformer import config as config_lib
    from transformer.model import sizes
    from transformer.parallel import sharding
    from transformer.train.resolve import resolve

    def derive(config, tokenizer, mesh=None, saved=None):
        return resolve(config, platform=None, tokenizer=tokenizer, mesh=mesh, saved=saved)[0]

    tok = SimpleNamespace(vocab_size=257, kind="byte")
    config = validate(base_config())
    model = lambda c: (c.model.vocab_size, c.model.vocab_used)  # noqa: E731
    assert model(derive(config, tok)) == (257, 0)
    by64 = config_lib.replace(config, **{"model.vocab_multiple": 64})
    assert model(derive(by64, tok)) == (320, 257)
    assert (sizes.model_config_of(by64).vocab_size, sizes.model_config_of(by64).vocab_used) == (
        320, 257)
    tensor2 = SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 2})
    on_mesh = derive(config, tok, tensor2)
    assert model(on_mesh) == (258, 257)
    sharding.check_fits(on_mesh, tensor2)
    assert model(derive(by64, tok, SimpleNamespace(shape={"data": 1, "fsdp": 1,
                                                           "tensor": 3}))) == (384, 257)
    saved = config_lib.to_dict(on_mesh)
    assert model(derive(config, tok, None, saved)) == (258, 257)
    by_hand = config_lib.replace(config, **{"model.vocab_size": 264})  # docs/scaling-out.md
    assert model(derive(by_hand, tok)) == (264, 257)  # its extra ids are padding too
    assert config.model.vocab_size == 0  # the caller's config is left as it is


def test_padded_ids_are_never_sampled_and_take_no_share_of_the_loss():
    """vocab_used=n: ids n .. V-1 get logit -inf, so a hot sampler (temperature 2, no top-k or
    top-p) never draws them; without the mask the same model draws them within 60 tokens.
    The loss is the cross-entropy over the n real ids alone, and the padding rows get no
    gradient."""
    n = V - 3
    config = dataclasses.replace(SMALL, vocab_used=n, tie_embeddings=False)
    params = init_params(config, jax.random.key(0))
    prompts = [[1, 2, 3], [4]]

    def sampled(cfg):
        out = decode.generate(cfg, params, prompts, max_new_tokens=60, temperature=2.0,
                              top_k=0, top_p=1.0, seed=0)
        return {t for row in out for t in row}
    assert max(sampled(config)) < n
    assert max(sampled(dataclasses.replace(config, vocab_used=0))) >= n  # the mask matters
    x_BT = tokens(length=T + 1) % n
    loss, grads = _loss_and_grads(config, params, x_BT)
    logits = forward(dataclasses.replace(config, vocab_used=0), params, x_BT[:, :-1])[..., :n]
    want = -jnp.take_along_axis(jax.nn.log_softmax(logits), x_BT[:, 1:, None], -1).mean()
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    assert not np.asarray(grads["head"]["kernel"][:, n:]).any()
    assert np.asarray(grads["head"]["kernel"][:, :n]).any()

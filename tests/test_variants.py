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
}
variant = pytest.mark.parametrize("name", list(VARIANTS))


def small(name, **kw):
    return dataclasses.replace(SMALL, **VARIANTS[name], **kw)


@functools.partial(jax.jit, static_argnums=0)
def forward(config, params, tokens_BT, positions_BT=None):
    return GPT(config).apply({"params": params}, tokens_BT, positions_BT)


cached_forward = jax.jit(decode._forward, static_argnums=0)  # index traced: two compiles


def tokens(B=2, length=T, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, length), 0, V)


def test_variants_cover_every_switch_value():
    seen = {f: {getattr(small(n), f) for n in VARIANTS} for f in
            ("position", "norm", "norm_placement", "mlp", "kv_heads", "attention_kernel")}
    assert seen["position"] == {"learned", "rope"}
    assert seen["norm"] == {"layernorm", "rmsnorm"}
    assert seen["norm_placement"] == {"pre", "post"}
    assert seen["mlp"] == {"relu", "gelu", "swiglu"}
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


@variant
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

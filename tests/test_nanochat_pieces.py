"""nanochat's and modded-nanogpt's pieces (issue 56), each stated by its defining property:
value embeddings, smear and backout in the model (causal, cached decoding equal to the full
pass), NorMuon, MuonEq and cautious weight decay in Muon (against steps computed by hand)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.generate import decode
from transformer.generate import step as decode_step
from transformer.model import gpt
from transformer.model.gpt import GPT, init_params
from transformer.train import muon, optimizer

V, T = 16, 16
# Every piece at once, on the modern block with grouped K/V heads (G = 2 of H = 4).
ALL = ModelConfig(vocab_size=V, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_seq_len=T,
                  matmul="plain", position="rope", norm="rmsnorm", mlp="swiglu",
                  n_kv_heads=2, tie_embeddings=False, value_embeds="alternate", smear=True,
                  backout=True, x0_lambdas=True)
NONE = dict(value_embeds="none", smear=False, backout=False, x0_lambdas=False)
PIECES = {"value_embeds": {**NONE, "value_embeds": "alternate"},
          "smear": {**NONE, "smear": True},
          "backout": {**NONE, "backout": True},
          "x0_lambdas": {**NONE, "x0_lambdas": True},
          "all": {}}
piece = pytest.mark.parametrize("name", list(PIECES))


def config(name, **kw):
    return dataclasses.replace(ALL, **PIECES[name], **kw)


def params_of(c, seed=0):
    """Initial parameters with the smear switched on: its gain starts at 0 (the model starts
    without it), which would make every test below pass for any smear."""
    p = init_params(c, jax.random.key(seed))
    if c.smear:
        p["smear"]["gain"] = jnp.full((1,), 0.7)
    return p


@functools.partial(jax.jit, static_argnums=0)
def forward(c, params, tokens_BT):
    return GPT(c).apply({"params": params}, tokens_BT)


cached_forward = jax.jit(decode_step.forward, static_argnums=0)


def tokens(B=2, seed=1):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, V)


def test_value_embeds_go_where_nanochat_and_modded_nanogpt_put_them():
    assert gpt.value_embed_layers(dataclasses.replace(ALL, n_layers=4)) == (1, 3)
    assert gpt.value_embed_layers(dataclasses.replace(ALL, n_layers=3)) == (0, 2)
    assert gpt.value_embed_layers(dataclasses.replace(ALL, n_layers=4, value_embeds="ends")) \
        == (0, 3)
    assert gpt.value_embed_layers(dataclasses.replace(ALL, n_layers=4, value_embeds="all")) \
        == (0, 1, 2, 3)
    p = params_of(config("value_embeds", n_layers=4))
    tables = {k: v["embedding"].shape for k, v in p.items() if k.startswith("value_embed_")}
    assert tables == {"value_embed_1": (V, 16), "value_embed_3": (V, 16)}  # G·K = 2·8


def test_a_value_embedding_row_is_added_to_the_values_of_its_token_only():
    """With the gate's weights at 0 the gate is 3·σ(0) = 1.5: moving the first value-embedding
    block's row of token `tok` by δ moves that block's values by 1.5·δ exactly at the
    positions holding `tok`, and nowhere else."""
    c = config("value_embeds")
    p = params_of(c)
    first = gpt.value_embed_layers(c)[0]
    p[f"block_{first}"]["attn"]["gate"] = jnp.zeros_like(p[f"block_{first}"]["attn"]["gate"])
    x_BT = tokens()
    tok = int(x_BT[0, 3])
    delta = jax.random.normal(jax.random.key(5), (c.kv_heads * c.head_dim,))
    moved = jax.tree.map(lambda a: a, p)
    table = p[f"value_embed_{first}"]["embedding"]
    moved[f"value_embed_{first}"] = {"embedding": table.at[tok].add(delta)}

    def values(params):
        _, state = GPT(c).apply({"params": params}, x_BT, mutable=["intermediates"])
        return state["intermediates"][f"block_{first}"]["attn"]["values"][0]  # [B, G, T, K]

    diff_BGTK = values(moved) - values(p)
    at_tok_BT = np.asarray(x_BT == tok)
    want = 1.5 * delta.reshape(c.kv_heads, c.head_dim)
    got_BTGK = np.asarray(diff_BGTK.transpose(0, 2, 1, 3))
    np.testing.assert_allclose(got_BTGK[at_tok_BT], np.broadcast_to(
        want, (at_tok_BT.sum(),) + want.shape), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_BTGK[~at_tok_BT], 0)


def test_value_embeddings_have_a_learning_rate_of_their_own():
    """train.value_embed_lr: the tables' AdamW update scales with it, every other
    parameter's update is the one it gets without it (b1 = b2 = 0: AdamW's step is ±lr)."""
    p = params_of(config("value_embeds"))
    grads = jax.tree.map(lambda x: jnp.ones_like(x), p)

    def update(**kw):
        c = base_config()
        c.train.update(optimizer="muon", lr=0.01, b1=0.0, b2=0.0, warmup_steps=0,
                       weight_decay=0.0, schedule="constant", **kw)
        opt = optimizer.make_optimizer(validate(c).train)
        return opt.update(grads, opt.init(p), p)[0]

    plain, own = update(), update(value_embed_lr=0.003)
    for path, u in jax.tree_util.tree_leaves_with_path(own):
        key = jax.tree_util.keystr(path)
        u0 = dict(jax.tree_util.tree_leaves_with_path(plain))[path]
        if key.startswith("['value_embed_"):
            np.testing.assert_allclose(u, 0.3 * np.asarray(u0), rtol=1e-5, err_msg=key)
            np.testing.assert_allclose(u0, -0.01, rtol=1e-4, err_msg=key)
        else:
            np.testing.assert_array_equal(u, u0, err_msg=key)


def test_smear_adds_a_gated_share_of_the_previous_tokens_embedding():
    """x'_t = x_t + λ·σ(x_t[:12]·w)·x_{t-1}, and x'_0 = x_0 (a text's first token has none)."""
    c = config("smear")
    x_BTD = jax.random.normal(jax.random.key(0), (2, 5, c.d_model))
    w = jax.random.normal(jax.random.key(1), (12, 1))
    smear = gpt.Smear(c)
    params = {"gate": w, "gain": jnp.array([0.7])}
    prev = jnp.pad(x_BTD[:, :-1], ((0, 0), (1, 0), (0, 0)))
    got = smear.apply({"params": params}, x_BTD, prev, jnp.broadcast_to(jnp.arange(5), (2, 5)))
    x = np.asarray(x_BTD, np.float64)
    gate = 0.7 / (1 + np.exp(-(x[..., :12] @ np.asarray(w, np.float64))))
    want = x.copy()
    want[:, 1:] += gate[:, 1:] * x[:, :-1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_backout_subtracts_a_share_of_the_middle_blocks_output_before_the_head():
    """logits = head(RMSNorm(x_L - λ·x_{L//2})), x_i the stream after block i, λ learned
    (from 0.2): computed here from the blocks' outputs of the model without backout."""
    c = config("backout")
    p = params_of(c)
    x_BT = tokens()
    plain = dataclasses.replace(c, backout=False)
    p_plain = {k: v for k, v in p.items() if k != "backout"}
    _, state = GPT(plain).apply({"params": p_plain}, x_BT, capture_intermediates=True,
                                mutable=["intermediates"])
    inter = state["intermediates"]
    x_L = inter[f"block_{c.n_layers - 1}"]["__call__"][0][0]
    x_mid = inter[f"block_{c.n_layers // 2}"]["__call__"][0][0]
    assert float(p["backout"]["gain"][0]) == pytest.approx(0.2)
    p["backout"]["gain"] = jnp.array([0.35])
    h = np.asarray(x_L - 0.35 * x_mid, np.float64)
    h = h / np.sqrt(np.mean(h ** 2, axis=-1, keepdims=True) + 1e-5)
    h = h * np.asarray(p["ln_final"]["scale"])
    want = h @ np.asarray(p["head"]["kernel"], np.float64)
    np.testing.assert_allclose(forward(c, p, x_BT), want, rtol=1e-4, atol=1e-5)


def test_x0_lambdas_feed_each_block_a_scaled_stream_plus_a_share_of_the_embedding():
    """Block i reads r_i·x + a_i·x0 (x0: the embedding): computed here block by block with the
    model's own blocks, from r = (1, 0.5, 2), a = (0, 0.3, -0.4)."""
    c = config("x0_lambdas")
    p = params_of(c)
    start = np.asarray(p["residual_gains"]["gain"])
    np.testing.assert_allclose(start, [[1.15, 1.10, 1.05], [0.20, 0.125, 0.05]], rtol=1e-6)
    r, a = [1.0, 0.5, 2.0], [0.0, 0.3, -0.4]
    p["residual_gains"]["gain"] = jnp.array([r, a])
    x_BT = tokens()
    x0 = p["embed"]["embedding"][x_BT]
    x = x0
    mask = gpt.attention.causal_mask(T, 0)
    positions = jnp.broadcast_to(jnp.arange(T), x_BT.shape)
    plain = dataclasses.replace(c, x0_lambdas=False)
    for i in range(c.n_layers):
        x = r[i] * x + a[i] * x0
        x, _ = gpt.Block(plain).apply({"params": p[f"block_{i}"]}, x, mask, positions)
    h = np.asarray(x, np.float64)
    h = h / np.sqrt(np.mean(h ** 2, axis=-1, keepdims=True) + 1e-5)
    want = (h * np.asarray(p["ln_final"]["scale"])) @ np.asarray(p["head"]["kernel"])
    np.testing.assert_allclose(forward(c, p, x_BT), want, rtol=1e-4, atol=1e-5)


@piece
def test_causal(name):
    """Changing token t changes no logit before t (and changes those from t on)."""
    c = config(name)
    p = params_of(c)
    x_BT = tokens()
    t = 7
    y_BT = x_BT.at[:, t].set((x_BT[:, t] + 1) % V)
    a, b = forward(c, p, x_BT), forward(c, p, y_BT)
    np.testing.assert_array_equal(a[:, :t], b[:, :t])
    assert jnp.abs(a[:, t] - b[:, t]).max() > 1e-6


def test_smear_alone_carries_token_t_to_position_t_plus_1():
    """A model whose attention cannot see the past (window 1) still reads token t at t + 1
    through the smear, and without it does not."""
    c = config("smear", sliding_window=1)
    p = params_of(c)
    x_BT = tokens()
    y_BT = x_BT.at[:, 7].set((x_BT[:, 7] + 1) % V)
    moved = jnp.abs(forward(c, p, x_BT) - forward(c, p, y_BT))[:, 8].max()
    off = dataclasses.replace(c, smear=False)
    p_off = {k: v for k, v in p.items() if k != "smear"}
    still = jnp.abs(forward(off, p_off, x_BT) - forward(off, p_off, y_BT))[:, 8].max()
    assert moved > 1e-4 and still == 0


@piece
def test_cached_decoding_equals_full_forward(name):
    """Prefill then one token at a time, with a left-padded row."""
    c = config(name)
    p = params_of(c)
    x_BT, pad = tokens(), 3  # row 1 is left-padded: its positions start at its first real token
    padded_BT = x_BT.at[1].set(jnp.roll(x_BT[1], pad).at[:pad].set(0))
    start_B = jnp.array([0, pad], jnp.int32)
    cache = decode.new_cache(config=c, batch=2)
    P = 5
    logits, cache = cached_forward(c, p, padded_BT[:, :P], cache, 0, start_B)
    steps = [logits]
    for i in range(P, T):
        logits, cache = cached_forward(c, p, padded_BT[:, i:i + 1], cache, i, start_B)
        steps.append(logits)
    cached_BTV = jnp.concatenate(steps, axis=1)
    full_BTV = forward(c, p, x_BT)
    np.testing.assert_allclose(cached_BTV[0], full_BTV[0], atol=2e-5)
    np.testing.assert_allclose(cached_BTV[1, pad:], full_BTV[1, :T - pad], atol=2e-5)
    assert ("x" in cache[0]) == c.smear


def test_cached_smear_with_one_slot_per_row_equals_the_full_forward():
    """Continuous batching's per-row slots (index [B]): rows at different points of their
    texts each read their own previous token's embedding."""
    c = config("smear")
    p = params_of(c)
    x_BT = tokens()
    cache = decode.new_cache(config=c, batch=2)
    start_B = jnp.zeros(2, jnp.int32)
    # Row 0 prefilled with 6 tokens, row 1 with 9 (each written at its own slots).
    _, cache = cached_forward(c, p, x_BT[:, :6], cache, jnp.array([0, 0]), start_B)
    _, cache1 = cached_forward(c, p, x_BT[:, 6:9], cache, jnp.array([6, 6]), start_B)
    cache = jax.tree.map(lambda a, b: a.at[c.kv_heads:].set(b[c.kv_heads:]), cache, cache1)
    token_B1 = jnp.stack([x_BT[0, 6], x_BT[1, 9]])[:, None]
    logits, _ = cached_forward(c, p, token_B1, cache, jnp.array([6, 9]), start_B)
    full = forward(c, p, x_BT)
    np.testing.assert_allclose(logits[0, 0], full[0, 6], atol=2e-5)
    np.testing.assert_allclose(logits[1, 0], full[1, 9], atol=2e-5)


@pytest.mark.parametrize("field", ["value_embeds", "backout", "x0_lambdas"])
def test_per_block_pieces_refuse_scanned_layers(field):
    c = base_config()
    c.model.update(scan_layers=True, **{field: "alternate" if field == "value_embeds" else True})
    with pytest.raises(ConfigError, match=f"model.{field}"):
        validate(c)


# Muon's pieces, each against a step computed by hand.
DENSE = optax.contrib.MuonDimensionNumbers(reduction_axis=(-2,), output_axis=(-1,))


def test_muon_eq_scales_each_output_neuron_to_the_mean_row_norm():
    """A [fan_in 2, fan_out 3] kernel: neuron j's weights are column j. ‖X‖_F² = 1+4+9+16+
    0+0 = 30, so every column gets norm √(30/3) = √10."""
    x = jnp.array([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]])  # columns' norms 1, √13, 4
    got = np.asarray(muon.equilibrate_rows(x, DENSE))
    want = np.array([[1.0, 2.0 / 13 ** 0.5, 0.0], [0.0, 3.0 / 13 ** 0.5, 1.0]]) * 10 ** 0.5
    want[:, 2] = np.array([0.0, 4.0]) * 10 ** 0.5 / 4
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_normuon_divides_each_column_by_its_moving_rms_and_keeps_the_norm():
    """U = [[3, 0, 1], [4, 2, 1]] (rows <= columns: moments per column), β2 = 0.5. Step 1:
    v = 0.5·(mean of the column's squares) = [6.25, 1, 0.5]; step 2 with the same U:
    v = 0.5·v + 0.5·m = [9.375, 1.5, 0.75]. U / √v, rescaled to ‖U‖ = √31."""
    u = jnp.array([[3.0, 0.0, 1.0], [4.0, 2.0, 1.0]])
    tx = muon.scale_by_normuon(0.5, lambda tree: jax.tree.map(lambda _: DENSE, tree))
    state = tx.init({"w": u})
    steps = []
    for _ in range(2):
        out, state = tx.update({"w": u}, state)
        steps.append(np.asarray(out["w"]))
    un = np.asarray(u)
    for got, v in zip(steps, ([6.25, 1.0, 0.5], [9.375, 1.5, 0.75])):
        scaled = un / np.sqrt(np.array(v))
        want = scaled * np.sqrt(31.0) / np.linalg.norm(scaled)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cautious_weight_decay_decays_only_where_the_step_already_shrinks_the_weight():
    """u + wd·p where u·p >= 0 (the step -lr·u moves p towards 0), u elsewhere."""
    u, p = jnp.array([1.0, -1.0, 1.0, -1.0, 0.0]), jnp.array([2.0, 2.0, -2.0, -2.0, 3.0])
    tx = muon.add_cautious_decayed_weights(0.1)
    got, _ = tx.update(u, tx.init(p), p)
    np.testing.assert_allclose(got, [1.2, -1.0, 1.0, -1.2, 0.3], rtol=1e-6)


def _muon_updates(**kw):
    p = init_params(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                max_seq_len=16, matmul="plain"), jax.random.key(0))
    keys = iter(jax.random.split(jax.random.key(3), 2 * len(jax.tree.leaves(p))))
    p = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), p)
    g = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), p)
    c = base_config()
    c.train.update(optimizer="muon", muon_lr=0.05, lr=0.01, weight_decay=0.0, warmup_steps=0,
                   schedule="constant", grad_clip=0.0, **kw)
    opt = optimizer.make_optimizer(validate(c).train)
    return p, opt.update(g, opt.init(p), p)[0]


def test_the_muon_fields_reach_the_optimizer():
    """Each field changes Muon's matrices' updates, and cautious decay is -lr·wd·p exactly
    where the undecayed step (-lr·u) and p have opposite signs."""
    p, plain = _muon_updates()
    kernel = lambda tree: np.asarray(tree["block_0"]["mlp"]["expand"]["kernel"])  # noqa: E731
    for kw in (dict(muon_eq=True), dict(muon_normuon_beta2=0.95)):
        assert not np.allclose(kernel(_muon_updates(**kw)[1]), kernel(plain), atol=1e-5), kw
    _, cautious = _muon_updates(muon_weight_decay=0.2, muon_cautious_wd=True)
    w = kernel(p)
    shrinks = kernel(plain) * w <= 0
    np.testing.assert_allclose(kernel(cautious) - kernel(plain), -0.05 * 0.2 * w * shrinks,
                               rtol=1e-4, atol=1e-7)
    # The embedding (AdamW) is untouched by all three.
    _, every = _muon_updates(muon_eq=True, muon_normuon_beta2=0.95, muon_cautious_wd=True,
                             muon_weight_decay=0.2)
    np.testing.assert_array_equal(every["embed"]["embedding"], plain["embed"]["embedding"])


@piece
def test_the_parameter_count_counts_every_piece(name):
    """flops.param_counts (what `sizes`, the docs and the scaling fits read) equals the
    parameters the model creates; value-embedding tables count as embeddings."""
    from transformer.model import flops
    c = config(name)
    counts = flops.param_counts(c)
    assert counts["total"] == gpt.count_params(init_params(c, jax.random.key(0)))
    tables = len(gpt.value_embed_layers(c)) * V * c.kv_heads * c.head_dim
    assert counts["value_embeddings"] == tables
    assert counts["total"] - counts["non_embedding"] == 2 * V * c.d_model + tables

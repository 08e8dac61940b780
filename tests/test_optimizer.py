"""The optimizer as training uses it (make_optimizer): what weight decay touches, the learning
rate each schedule gives at each step, and gradient accumulation equal to one big batch."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.model.gpt import init_params
from transformer.train import optimizer
from transformer.train import step as step_lib


def _model(scan_layers):
    return ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                       max_seq_len=16, scan_layers=scan_layers, matmul="plain",
                       tie_embeddings=False)


def _train_config(**changes):
    c = base_config()
    c.train.update(steps=20, lr=0.01, warmup_steps=0, grad_clip=0.0, weight_decay=0.5)
    c.train.update(changes)
    return validate(c).train


def _leaf_names(params):
    return {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def _role_decayed(path: str) -> bool:
    """The intended roles, written out independently of optimizer.py's rule."""
    return path.endswith(("['kernel']", "['embedding']", "['pos_embed']"))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_adamw_with_zero_gradient_shrinks_exactly_the_decayed_roles(scan_layers):
    params = init_params(_model(scan_layers), jax.random.key(0))
    params = jax.tree.map(lambda x: x + 1.0, params)  # no zero leaves: decay must show
    opt = optimizer.make_optimizer(_train_config())
    zero = jax.tree.map(jnp.zeros_like, params)
    # one program (eagerly, every op of the update on every leaf shape was one)
    updates = jax.jit(lambda z, p: opt.update(z, opt.init(p), p)[0])(zero, params)
    new = _leaf_names(optax.apply_updates(params, updates))
    old = _leaf_names(params)
    decayed = {p for p in old if _role_decayed(p)}
    assert any("scale" in p for p in old) and any("bias" in p for p in old)
    assert {"['embed']['embedding']", "['pos_embed']"} <= decayed
    for path in old:
        shrunk = np.all(np.abs(np.asarray(new[path])) < np.abs(np.asarray(old[path])))
        same = np.array_equal(np.asarray(new[path]), np.asarray(old[path]))
        assert (shrunk if path in decayed else same), path


def test_the_old_shape_rule_decays_norms_when_layers_are_scanned():
    """Documents the bug the role rule fixes: `ndim >= 2` marks stacked norm scales and the
    [H, K] attention biases; the role rule marks neither, in either layout."""
    for scan_layers in (False, True):
        params = init_params(_model(scan_layers), jax.random.key(0))
        old_rule = _leaf_names(jax.tree.map(lambda x: x.ndim >= 2, params))
        new_rule = _leaf_names(optimizer.decay_mask(params))
        norms = [p for p in old_rule if p.endswith(("['scale']", "['bias']"))]
        assert norms and not any(new_rule[p] for p in norms)
        qkv_bias = [p for p in norms if "['query']['bias']" in p]
        assert qkv_bias and all(old_rule[p] for p in qkv_bias)  # [H, K] or [L, H, K]
        ln_scale = [p for p in norms if "['ln_attn']['scale']" in p]
        assert all(old_rule[p] for p in ln_scale) == scan_layers


def test_an_unknown_parameter_name_is_refused():
    with pytest.raises(ValueError, match="no weight-decay role"):
        optimizer.decay_mask({"mystery": jnp.ones((2, 2))})


def _lrs(**changes):
    """The learning rate of every update, read off make_optimizer's AdamW: with b1 = b2 = 0,
    no decay and a unit gradient, each update moves the parameter by -lr (to ~1e-8)."""
    t = _train_config(b1=0.0, b2=0.0, weight_decay=0.0, **changes)
    opt = optimizer.make_optimizer(t)
    params = {"kernel": jnp.zeros(())}
    state = opt.init(params)
    lrs = []
    for _ in range(t.steps):
        updates, state = opt.update({"kernel": jnp.ones(())}, state, params)
        lrs.append(-float(updates["kernel"]))
    return np.array(lrs)


def test_cosine_warms_up_linearly_then_decays_to_the_floor():
    lrs = _lrs(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    np.testing.assert_allclose(lrs[:10], np.arange(1, 11) / 10, atol=1e-6)  # 0.1 .. 1.0
    assert np.all(np.diff(lrs[9:]) < 0)
    mid = 9 + 45  # half way from the peak (update 9) to the last (99): (1 + 0.1) / 2
    assert lrs[mid] == pytest.approx(0.55, abs=1e-6)
    assert lrs[-1] == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize("shape,f", [("linear", lambda p: 1 - p),
                                     ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))),
                                     ("sqrt", lambda p: 1 - math.sqrt(p))])
def test_wsd_holds_the_peak_then_decays_in_the_last_fraction(shape, f):
    lrs = _lrs(steps=100, lr=2.0, warmup_steps=5, schedule="wsd", decay_fraction=0.2,
               decay_shape=shape, min_lr_ratio=0.0)
    np.testing.assert_allclose(lrs[4:80], 2.0, atol=1e-6)  # at the peak from update 4 to 79
    expected = [2.0 * f((s - 79) / 20) for s in range(80, 100)]  # the last 20 updates decay
    np.testing.assert_allclose(lrs[80:], expected, atol=1e-6)


def test_constant_schedule_stays_at_the_peak_after_warmup():
    lrs = _lrs(steps=30, lr=0.5, warmup_steps=4, schedule="constant")
    np.testing.assert_allclose(lrs[3:], 0.5, atol=1e-6)
    assert lrs[0] == pytest.approx(0.5 / 4, abs=1e-6)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
@pytest.mark.parametrize("warmup", [0, 1, 10])
def test_no_update_is_wasted_and_the_last_reaches_the_floor(schedule, warmup):
    """configs/tiny.py's schedule (50 steps, warmup 10, floor 0.1·lr), read off AdamW: the
    first update moves the weights, the last is made at exactly lr·min_lr_ratio. (The old
    schedule gave the first update lr = 0 and ended WSD at 0.19·lr, cosine at 0.101·lr.)"""
    lrs = _lrs(steps=50, lr=3e-3, warmup_steps=warmup, schedule=schedule, min_lr_ratio=0.1)
    assert lrs[0] > 0
    assert lrs.max() == pytest.approx(3e-3, rel=1e-5)
    assert lrs[-1] == pytest.approx(3e-4, rel=1e-5)


@pytest.mark.parametrize("field,value", [("schedule", "step"), ("decay_shape", "exp"),
                                         ("decay_fraction", 0.0), ("grad_accum", 3)])
def test_bad_schedule_or_accumulation_names_the_field(field, value):
    c = base_config()
    c.train[field] = value
    with pytest.raises(ConfigError, match=f"train.{field}"):
        validate(c)


def test_k_micro_batches_give_the_update_of_one_big_batch():
    """The gradient (what the update is made of) and the step's metrics of 4 micro-batches of
    2 rows equal those of one batch of 8, with an uneven number of counted targets per row.
    (Parameters after Adam's first step are not compared: it divides by |g|, which turns the
    rounding noise of a gradient that is exactly zero in theory, the key bias's, into ±lr.)"""
    model = ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                        max_seq_len=16, matmul="plain")
    opt = optimizer.make_optimizer(_train_config(grad_clip=1.0))
    state = step_lib.init_state(model, opt, 0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (8, 17))
    weights = (rng.random((8, 16)) < 0.7).astype(np.float32)
    weights[::4] = 0.0  # micro-batches count different numbers of targets
    weights[0, :3] = 1.0
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}
    grads = {k: jax.jit(lambda p, b, k=k: step_lib.accumulated_grad(p, b, model, k))(
        state.params, batch) for k in (1, 4)}
    assert float(grads[4][0]) == pytest.approx(float(grads[1][0]), rel=1e-6)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads[1][1]))
    for a, b in zip(jax.tree.leaves(grads[1][1]), jax.tree.leaves(grads[4][1])):
        np.testing.assert_allclose(a, b, atol=1e-6 * scale, rtol=1e-5)
    step = lambda k: jax.jit(lambda s, b: step_lib.train_step(  # noqa: E731
        s, b, model_config=model, optimizer=opt, micro_batches=k))(state, batch)
    (_, m1), (_, m4) = step(1), step(4)
    assert float(m4["train_loss"]) == pytest.approx(float(m1["train_loss"]), rel=1e-6)
    assert float(m4["grad_norm"]) == pytest.approx(float(m1["grad_norm"]), rel=1e-5)


def test_the_accumulation_check_would_catch_an_unweighted_mean(monkeypatch):
    """Averaging micro-batch means without their target counts misses the tolerance used above
    by two orders of magnitude, even at initialisation where every loss is near ln V."""
    model = ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                        max_seq_len=16, matmul="plain")
    params = init_params(model, jax.random.key(0))
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 32, (4, 17))
    weights = np.ones((4, 16), np.float32)
    weights[1::2, 4:] = 0.0  # rows 1 and 3 (micro-batch 1 of 2) count 4 targets each
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}
    # jitted, as the step runs them (eagerly every op of the backward was a program: ~3 s)
    loss_full, _ = jax.jit(step_lib.accumulated_grad, static_argnums=(2, 3))(params, batch,
                                                                             model, 1)
    halves = [jax.tree.map(lambda x, i=i: x[i::2], batch) for i in range(2)]
    loss = jax.jit(step_lib.loss_fn, static_argnums=2)
    unweighted = np.mean([float(loss(params, h, model)) for h in halves])
    assert abs(unweighted - float(loss_full)) > 100 * 1e-6 * float(loss_full)  # the tolerance above


def test_the_bench_peer_decays_the_same_tensors_as_we_do():
    """The PyTorch peer (HF GPT-2 + torch AdamW) decays what optimizer.decays decays: the
    same number of decayed and of undecayed weights, for tied and untied heads."""
    pytest.importorskip("torch")
    from transformer.tools import bench
    for tied in (True, False):
        model = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                            max_seq_len=32, tie_embeddings=tied, matmul="plain")
        ours = {True: 0, False: 0}
        params = jax.eval_shape(lambda k: init_params(model, k), jax.random.key(0))  # sizes
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            ours[optimizer.decays(path)] += leaf.size
        peer = bench.PeerModel(model, base_config().train, seq_len=32)
        theirs = {True: 0, False: 0}
        for group in peer.opt.param_groups:
            theirs[group["weight_decay"] > 0] += sum(p.numel() for p in group["params"])
        assert theirs == ours, (tied, theirs, ours)


# Muon (train.optimizer=muon): which parameters it trains, how it sees per-head kernels as
# matrices, and the stacked layer axis of scan_layers.

def _muon_config(**changes):
    return _train_config(**{"optimizer": "muon", "muon_lr": 0.05, "lr": 0.01,
                            "weight_decay": 0.0, "schedule": "constant", **changes})


def _random_like(params, seed):
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape, x.dtype), params)


def _updates(opt, params, grads_seq):
    state, out = opt.init(params), []
    for grads in grads_seq:
        updates, state = opt.update(grads, state, params)
        out.append(updates)
    return out


def _muon_paths(params) -> set[str]:
    """The parameters `optimizer.muon_dimensions` hands to Muon (the rest go to AdamW)."""
    dims = _leaf_names(jax.tree.map(lambda d: d is not None, optimizer.muon_dimensions(params),
                                    is_leaf=lambda x: x is None or
                                    isinstance(x, optax.contrib.MuonDimensionNumbers)))
    return {p for p, is_muon in dims.items() if is_muon}


def _random_params_and_muon_paths():
    """Random parameters of the small untied model (no zero leaf) and the paths Muon trains:
    both halves non-empty."""
    params = _random_like(init_params(_model(False), jax.random.key(0)), 1)
    muon = _muon_paths(params)
    assert muon and set(_leaf_names(params)) - muon
    return params, muon


@pytest.mark.parametrize("scan_layers", [False, True])
def test_muon_trains_the_blocks_matrices_and_adamw_the_rest(scan_layers):
    """Muon gets exactly the blocks' attention and MLP kernels; the untied head's kernel is
    2-D too and stays with AdamW, as do embeddings, the position table, norms and biases."""
    params = init_params(_model(scan_layers), jax.random.key(0))
    muon = _muon_paths(params)
    expected = {p for p in _leaf_names(params) if p.endswith("['kernel']")
                and ("['attn']" in p or "['mlp']" in p)}
    assert muon == expected and len(muon) == (6 if scan_layers else 12)
    assert "['head']['kernel']" not in muon


def _as_matrix(name, x):
    """The 2-D matrix each kernel applies, written out here independently of optimizer.py:
    q/k/v [D, H, K] -> D x (H*K); out [H, K, D] -> (H*K) x D; MLP kernels as they are."""
    if name in ("query", "key", "value"):
        return x.reshape(x.shape[0], -1)
    if name == "out":
        return x.reshape(-1, x.shape[-1])
    return x


def test_a_per_head_kernel_gets_muons_update_of_its_2d_matrix():
    """Three steps of our Muon on the model's [D, H, K] and [H, K, D] kernels equal optax's
    plain 2-D Muon (optax.contrib.muon, its default matrix rule) on the reshaped matrices,
    update for update. (One Muon over each head alone, or over [D·H, K], would differ.)"""
    params = init_params(_model(False), jax.random.key(0))
    block = params["block_0"]
    names = {"query": block["attn"]["query"]["kernel"], "key": block["attn"]["key"]["kernel"],
             "value": block["attn"]["value"]["kernel"], "out": block["attn"]["out"]["kernel"],
             "expand": block["mlp"]["expand"]["kernel"],
             "project": block["mlp"]["project"]["kernel"]}
    assert names["query"].ndim == 3 and names["out"].ndim == 3
    grads_seq = [_random_like(params, s) for s in range(3)]
    ours = _updates(optimizer.make_optimizer(_muon_config()), params, grads_seq)

    def kernel(tree, name):
        module = "attn" if name in ("query", "key", "value", "out") else "mlp"
        return tree["block_0"][module][name]["kernel"]

    flat = {n: _as_matrix(n, x) for n, x in names.items()}
    reference = optax.contrib.muon(learning_rate=0.05, beta=0.95, nesterov=True)
    theirs = _updates(reference, flat, [{n: _as_matrix(n, kernel(g, n)) for n in names}
                                        for g in grads_seq])
    for step in range(3):
        for n in names:
            got = _as_matrix(n, kernel(ours[step], n))
            np.testing.assert_allclose(got, theirs[step][n], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{n}, step {step}")
    # The rule matters: Muon of the query kernel head by head is another update.
    per_head = optax.contrib.muon(learning_rate=0.05)
    q = names["query"]
    u, _ = per_head.update({"h0": kernel(grads_seq[0], "query")[:, 0]},
                           per_head.init({"h0": q[:, 0]}), {"h0": q[:, 0]})
    assert not np.allclose(u["h0"], kernel(ours[0], "query")[:, 0], rtol=1e-3)


def test_with_scanned_layers_each_layer_is_its_own_matrix():
    """The stacked [L, ...] kernels of model.scan_layers get, layer by layer, the updates the
    unrolled stack's kernels get: the layer axis is a batch axis, not a matrix dimension."""
    unrolled = init_params(_model(False), jax.random.key(0))
    scanned = init_params(_model(True), jax.random.key(0))

    def stack(tree):  # the unrolled tree in the scanned layout
        out = {k: v for k, v in tree.items() if not k.startswith("block_")}
        out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), tree["block_0"], tree["block_1"])
        return out

    assert jax.tree.structure(stack(unrolled)) == jax.tree.structure(scanned)
    grads_seq = [_random_like(unrolled, s) for s in range(3)]
    opt = optimizer.make_optimizer(_muon_config())
    ours = _updates(opt, unrolled, grads_seq)
    stacked = _updates(opt, stack(unrolled), [stack(g) for g in grads_seq])
    for a, b in zip(ours, stacked):
        for x, y in zip(jax.tree.leaves(stack(a)), jax.tree.leaves(b)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    # Orthogonalising the [L·D, H·K] stack as one matrix would not give these updates.
    joint = optax.contrib.muon(learning_rate=0.05)
    q = stack(unrolled)["blocks"]["attn"]["query"]["kernel"]
    g = stack(grads_seq[0])["blocks"]["attn"]["query"]["kernel"].reshape(-1, q[0, 0].size)
    u, _ = joint.update({"q": g}, joint.init({"q": g}), {"q": g})
    assert not np.allclose(u["q"].reshape(q.shape), stacked[0]["blocks"]["attn"]["query"]["kernel"],
                           rtol=1e-3)


def _matrices_for_batching():
    """Kernels of mixed shapes as the batched Newton-Schulz groups them: two [D, H, K] per-head
    kernels and a wide [D, F] (one group of 16 x 16 after reshaping with the [H, K, D] one),
    a tall [F, D] that must be transposed into the wide group, and a scan-stacked
    [L, D, H, K] whose layer axis is a batch axis."""
    shapes = {"q": (16, 2, 8), "k": (16, 2, 8), "o": (2, 8, 16), "up": (16, 40),
              "down": (40, 16), "stacked_q": (3, 16, 2, 8)}
    dims = {"q": optimizer._QKV, "k": optimizer._QKV, "o": optimizer._OUT,
            "up": optimizer._DENSE, "down": optimizer._DENSE, "stacked_q": optimizer._QKV}
    keys = jax.random.split(jax.random.key(3), len(shapes))
    tree = {n: jax.random.normal(k, s) for (n, s), k in zip(shapes.items(), keys)}
    return tree, dims


def _equals_optax_per_matrix(orthogonalize) -> bool:
    from optax.contrib._muon import orthogonalize_via_newton_schulz
    tree, dims = _matrices_for_batching()
    coeffs = jnp.asarray((3.4445, -4.7750, 2.0315))
    ours = orthogonalize(tree, dims, coeffs, 5)
    for name, x in tree.items():
        theirs = orthogonalize_via_newton_schulz(x, coeffs, 5, dimension_numbers=dims[name])
        if ours[name].shape != x.shape or not np.allclose(ours[name], theirs, rtol=1e-5,
                                                          atol=2e-6):
            return False
    return True


def test_batched_newton_schulz_equals_optax_matrix_by_matrix(monkeypatch):
    """muon.orthogonalize stacks same-shaped matrices into one batched Newton-Schulz; each
    matrix must still come out as optax orthogonalises it alone (up to float rounding). A
    planted mistake, normalising the stack by its joint norm instead of each matrix by its
    own, is caught by the same comparison."""
    from transformer.train import muon
    assert _equals_optax_per_matrix(muon.orthogonalize)

    def joint_norm(x_NRC, coeffs, ns_steps, eps=1e-8, dtype=None):
        return muon.iterate(x_NRC / (jnp.sqrt(jnp.sum(jnp.square(x_NRC))) + eps), coeffs,
                            ns_steps, dtype)

    monkeypatch.setattr(muon, "newton_schulz", joint_norm)
    assert not _equals_optax_per_matrix(muon.orthogonalize)


def test_bfloat16_newton_schulz_rounds_only_the_matmul_inputs():
    """train.muon_ns_dtype=bfloat16 reaches the Newton-Schulz matmuls: the update differs from
    the float32 one by bfloat16 rounding (not more: the iterate stays float32), and it is
    still as orthogonal (singular values in optax's 0.5-1.5 band)."""
    params = {"block_0": {"mlp": {"project": {"kernel": jnp.zeros((64, 32))}}}}
    grads = {"block_0": {"mlp": {"project": {"kernel": jax.random.normal(jax.random.key(1),
                                                                          (64, 32))}}}}

    def update(dtype):
        (u,) = _updates(optimizer.make_optimizer(_muon_config(muon_lr=1.0,
                                                              muon_ns_dtype=dtype)),
                        params, [grads])
        return np.asarray(u["block_0"]["mlp"]["project"]["kernel"])

    f32, bf16 = update("float32"), update("bfloat16")
    assert not np.array_equal(f32, bf16)
    assert np.abs(f32 - bf16).max() < 0.05 * np.abs(f32).max()
    s = np.linalg.svd(bf16, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5


def test_muon_and_adamw_each_follow_the_schedule_from_their_own_peak():
    """The first update of a matrix and of a bias under warm-up: muon_lr / warmup and
    lr / warmup times what each rule gives at a unit peak."""
    params = {"block_0": {"attn": {"out": {"kernel": jnp.eye(4).reshape(2, 2, 4)}},
                          "mlp": {"project": {"bias": jnp.zeros(4)}}}}
    grads = jax.tree.map(jnp.ones_like, params)

    def first(**changes):
        t = _muon_config(warmup_steps=4, b1=0.0, b2=0.0, **changes)
        (u,) = _updates(optimizer.make_optimizer(t), params, [grads])
        return (np.asarray(u["block_0"]["attn"]["out"]["kernel"]),
                np.asarray(u["block_0"]["mlp"]["project"]["bias"]))

    m1, b1 = first(muon_lr=1.0, lr=1.0)
    m2, b2 = first(muon_lr=0.3, lr=0.02)
    np.testing.assert_allclose(b1, -0.25, rtol=1e-5)  # AdamW, b1=b2=0: -lr/warmup
    np.testing.assert_allclose(m2, 0.3 * m1, rtol=1e-5)
    np.testing.assert_allclose(b2, 0.02 * b1, rtol=1e-5)


def test_muons_weight_decay_is_decoupled_times_its_lr_and_touches_only_its_matrices():
    """train.muon_weight_decay=w (configs/default.py's 0.2) adds -lr_t·w·W to each Muon
    matrix's update, lr_t Muon's scheduled rate at that update, beside the orthogonalised
    step it would get anyway; AdamW's parameters (embedding, head, norms, biases) get the
    update they get without it."""
    params, muon = _random_params_and_muon_paths()
    grads_seq = [_random_like(params, 2), _random_like(params, 3)]
    t = dict(schedule="cosine", steps=5, warmup_steps=0, min_lr_ratio=0.1)
    plain = _updates(optimizer.make_optimizer(_muon_config(**t)), params, grads_seq)
    decayed = _updates(optimizer.make_optimizer(_muon_config(muon_weight_decay=0.2, **t)),
                       params, grads_seq)
    schedule = optimizer.learning_rate(_muon_config(**t), 0.05)
    for i, (u0, u1) in enumerate(zip(plain, decayed)):
        lr_i = float(schedule(i))
        assert lr_i < 0.05 or i == 0  # the decay follows the schedule, not the peak
        for path, w in _leaf_names(params).items():
            got = np.asarray(_leaf_names(u1)[path]) - np.asarray(_leaf_names(u0)[path])
            want = -lr_i * 0.2 * np.asarray(w) if path in muon else np.zeros_like(got)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7, err_msg=path)


def test_b1_is_adams_first_moment_for_the_adamw_half_and_leaves_muon_alone():
    """train.b1 (configs/default.py's 0.8) is the first-moment decay of the AdamW half only:
    with b2 = 0 and no decay Adam's second update is -lr·(b1·g1 + g2)/(1 + b1)/(|g2| + eps)
    (the bias-corrected mean of two gradients over the last one's size), written out here
    from Adam's definition; Muon's matrices get the same update whatever b1 is (their
    momentum is train.muon_momentum)."""
    params, muon = _random_params_and_muon_paths()
    g1, g2 = _random_like(params, 2), _random_like(params, 3)
    lr, eps = 0.01, 1e-8  # _muon_config's AdamW rate; optax's default eps
    updates = {b1: _updates(optimizer.make_optimizer(_muon_config(b1=b1, b2=0.0)), params,
                            [g1, g2])[1] for b1 in (0.9, 0.8)}
    first, second = _leaf_names(g1), _leaf_names(g2)
    for path in _leaf_names(params):
        got = {b1: np.asarray(_leaf_names(u)[path]) for b1, u in updates.items()}
        if path in muon:
            np.testing.assert_array_equal(got[0.8], got[0.9], err_msg=path)
            continue
        g1_, g2_ = np.asarray(first[path]), np.asarray(second[path])
        for b1 in (0.9, 0.8):
            want = -lr * (b1 * g1_ + g2_) / (1 + b1) / (np.abs(g2_) + eps)
            np.testing.assert_allclose(got[b1], want, rtol=2e-4, atol=1e-7, err_msg=path)


def test_fewer_newton_schulz_steps_orthogonalise_less():
    """train.muon_ns_steps reaches optax: with 1 step the update of a matrix is far from
    orthogonal, with 5 its singular values are all near 1 (0.5-1.5 by design of the
    coefficients), times lr."""
    params = {"block_0": {"mlp": {"project": {"kernel": jnp.zeros((16, 16))}}}}
    grads = {"block_0": {"mlp": {"project": {"kernel": jax.random.normal(jax.random.key(1),
                                                                          (16, 16))}}}}

    def singular_values(steps):
        t = _muon_config(muon_lr=1.0, muon_ns_steps=steps)
        (u,) = _updates(optimizer.make_optimizer(t), params, [grads])
        return np.linalg.svd(np.asarray(u["block_0"]["mlp"]["project"]["kernel"]),
                             compute_uv=False)

    five, one = singular_values(5), singular_values(1)
    assert five.min() > 0.5 and five.max() < 1.5
    assert one.min() < 0.3 * five.min()


@pytest.mark.parametrize("matmul,dtype,expected", [
    ("fast_bf16", "float32", "bfloat16"),  # bf16 matmul inputs: the CPUs that multiply them
    ("fast_f32", "float32", "float32"),
    ("plain", "float32", "float32"),
    ("plain", "bfloat16", "bfloat16"),  # a bfloat16 model (accelerators)
])
def test_muon_ns_dtype_auto_follows_the_models_matmul_dtype(matmul, dtype, expected):
    from transformer.config import base_config
    from transformer.train.resolve import resolve

    c = base_config()
    c.model.update(matmul=matmul, dtype=dtype)
    c.train.optimizer = "muon"
    assert c.train.muon_ns_dtype == "auto"
    resolved, _ = resolve(c)
    assert resolved.train.muon_ns_dtype == expected
    c.train.muon_ns_dtype = "float32"  # a value given is kept
    assert resolve(c)[0].train.muon_ns_dtype == "float32"


def test_polar_express_comes_closer_to_the_polar_factor_than_the_quintic_in_five_steps():
    """train.muon_ns_coeffs=polar_express reaches the optimizer and orthogonalises better
    than Jordan's quintic at the same 5 steps: on a 64 x 64 matrix with singular values
    from 1e-2 to 1, every singular value of the update lies within 0.2 of 1 (0.86-1.14),
    where the quintic's spread past it by design (0.68-1.20), and it is what the five
    triples, applied in order, give in numpy (the triples in the wrong order miss it)."""
    from transformer.train import muon
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.normal(size=(64, 64)))
    v, _ = np.linalg.qr(rng.normal(size=(64, 64)))
    g = (u * np.geomspace(1e-2, 1.0, 64)) @ v.T
    params = {"block_0": {"mlp": {"project": {"kernel": jnp.zeros((64, 64))}}}}
    grads = {"block_0": {"mlp": {"project": {"kernel": jnp.asarray(g, jnp.float32)}}}}

    def update(coeffs):
        t = _muon_config(muon_lr=1.0, muon_ns_coeffs=coeffs, muon_momentum=0.0)
        (out,) = _updates(optimizer.make_optimizer(t), params, [grads])
        return np.asarray(out["block_0"]["mlp"]["project"]["kernel"], np.float64)

    def off(x):
        return np.abs(np.linalg.svd(x, compute_uv=False) - 1).max()

    polar, quintic = update("polar_express"), update("quintic")
    assert off(polar) < 0.2 < off(quintic), (off(polar), off(quintic))

    def by_hand(triples):  # Muon's update is -lr x the orthogonalised momentum
        x = g / (np.linalg.norm(g) + 1e-8)
        for a, b, c in triples:
            s = x @ x.T
            x = a * x + (b * s + c * s @ s) @ x
        return -x
    np.testing.assert_allclose(polar, by_hand(muon.POLAR_EXPRESS), atol=2e-3)
    assert np.abs(polar - by_hand(muon.POLAR_EXPRESS[::-1])).max() > 0.05
    c = base_config()
    c.train.update(optimizer="muon", muon_ns_coeffs="polar_express", muon_ns_steps=6)
    with pytest.raises(ConfigError, match="train.muon_ns_steps"):
        validate(c)

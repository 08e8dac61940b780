"""The width rule (train.lr_base_width, train/width_lr.py): each parameter's learning rate is
the one the rule states, read off the optimizer's own update; at lr_base_width == d_model
training is bitwise unchanged; the ladders resolve with the rule on."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ModelConfig, base_config, validate
from transformer.model.gpt import init_params
from transformer.scaling import sweep as scaling
from transformer.train import optimizer, width_lr
from transformer.train import step as step_lib

ROOT = Path(__file__).resolve().parents[1]

# The blocks' hidden matrices, written out independently of width_lr.HIDDEN: these and only
# these step at lr · base / d_model; embeddings, the position table, the untied head, norm
# scales and every bias stay at lr.
HIDDEN_SUFFIXES = tuple(f"['{m}']['{k}']['kernel']" for m, ks in
                        (("attn", ("query", "key", "value", "out")),
                         ("mlp", ("expand", "gate", "project"))) for k in ks)


def _model(d_model, scan_layers=False, **kw):
    return ModelConfig(vocab_size=32, d_model=d_model, n_layers=2, n_heads=2,
                       d_ff=2 * d_model, max_seq_len=16, scan_layers=scan_layers,
                       matmul="plain", **kw)


def _train(**changes):
    c = base_config()
    c.train.update(steps=10, lr=0.01, warmup_steps=0, schedule="constant", grad_clip=0.0,
                   weight_decay=0.0, b1=0.0, b2=0.0)
    c.train.update(changes)
    return validate(c).train


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_each_parameter_steps_at_the_rate_the_rule_states(scan_layers, mlp):
    """With b1 = b2 = 0 and no decay, Adam's first update is -lr·sign(g) (to ~1e-6 for |g| >>
    eps), so |update| / lr is each parameter's own multiplier: 16/64 = 1/4 for the hidden
    matrices at d_model 64 and base width 16, exactly 1 for everything else."""
    model = _model(64, scan_layers, mlp=mlp, tie_embeddings=False)
    params = init_params(model, jax.random.key(0))
    t = _train(lr_base_width=16)
    opt = optimizer.make_optimizer(t, model.d_model)
    ones = jax.tree.map(jnp.ones_like, params)  # |g| = 1 everywhere: no sign(0) leaves
    updates, _ = opt.update(ones, opt.init(params), params)
    seen = set()
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
        name = jax.tree_util.keystr(path)
        hidden = name.endswith(HIDDEN_SUFFIXES)
        seen.add(hidden)
        np.testing.assert_allclose(np.abs(np.asarray(u)) / t.lr, 0.25 if hidden else 1.0,
                                   rtol=1e-5, err_msg=name)
    assert seen == {True, False}
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    assert sum(n.endswith(HIDDEN_SUFFIXES) for n in names) == (7 if mlp == "swiglu" else 6) * (
        1 if scan_layers else model.n_layers)
    assert "['head']['kernel']" in names  # the untied head is a 2-D kernel, and stays at lr


def test_the_multiplier_is_base_over_width_and_one_when_off():
    assert width_lr.multiplier(_train(lr_base_width=32), 128) == 0.25
    assert width_lr.multiplier(_train(lr_base_width=128), 32) == 4.0
    assert width_lr.multiplier(_train(lr_base_width=0), 128) == 1.0
    with pytest.raises(ValueError, match="d_model"):
        optimizer.make_optimizer(_train(lr_base_width=32))


def test_at_base_width_equal_to_d_model_training_is_bitwise_unchanged():
    """Three real steps (AdamW, decay, clipping, warm-up, cosine) with the rule off and with
    lr_base_width == d_model: the same parameters and optimizer state, bit for bit; and the
    rule at another width does change them (so the comparison can fail)."""
    model = _model(32)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (4, 17))
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
             "weights": np.ones((4, 16), np.float32)}

    def after(lr_base_width):
        t = _train(lr_base_width=lr_base_width, b1=0.9, b2=0.95, weight_decay=0.1,
                   grad_clip=1.0, warmup_steps=2, schedule="cosine")
        opt = optimizer.make_optimizer(t, model.d_model)
        state = step_lib.init_state(model, opt, 0)
        step = jax.jit(lambda s, b: step_lib.train_step(s, b, model_config=model,
                                                        optimizer=opt, micro_batches=1))
        for _ in range(3):
            state, _ = step(state, batch)
        return state

    states = after(0), after(32), after(16)
    # The rule adds nothing to the saved state: a checkpoint restores with it on or off.
    assert len({jax.tree.structure(s) for s in states}) == 1
    off, same, other = (jax.tree.leaves(s) for s in states)
    for a, b in zip(off, same):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(off, other))


def _sweep(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / "scaling" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


# lr_transfer sweeps the rule off and on; the depth configs scale their rates by
# config/depth.py's rules instead (tests/test_depth.py)
LADDERS = sorted(p.stem for p in (ROOT / "configs" / "scaling").glob("*.py")
                 if p.stem != "lr_transfer" and not p.stem.startswith("depth_"))


@pytest.mark.parametrize("name", LADDERS)
def test_the_ladders_resolve_with_the_rule_on(name):
    """Every member of every ladder config carries the rule (the ladders' default), and its
    optimizer builds at the member's own width with the stated multiplier."""
    members = scaling.members(_sweep(name))
    assert len(LADDERS) >= 7
    widths = {m.config.train.lr_base_width for m in members}
    assert len(widths) == 1 and widths.pop() > 0
    for m in members[:3]:
        t, d = m.config.train, m.config.model.d_model
        assert width_lr.multiplier(t, d) == t.lr_base_width / d
        optimizer.make_optimizer(t, d)


def test_the_lr_transfer_study_has_the_rule_off_and_on_at_every_lr():
    sweep = _sweep("lr_transfer")
    members = scaling.members(sweep)
    got = {(m.config.train.lr_base_width, m.config.train.lr, m.config.model.d_model)
           for m in members}
    assert {w for w, _, _ in got} == {0, 16}
    assert {d for _, _, d in got} == {16, 32, 64}  # 4x in width
    assert len(got) == len(members)


def test_under_muon_the_rule_changes_nothing():
    """Muon's update is already normalised by the matrix's shape, and with
    train.optimizer=muon AdamW trains no hidden matrix: the rule leaves every update of two
    steps bitwise as it was, where under AdamW the same rule changes them."""
    from transformer.config import fields
    if "muon" not in getattr(fields, "OPTIMIZERS", ()):
        pytest.skip("train.optimizer=muon is not on this branch (branch optim)")
    model = _model(64)
    params = init_params(model, jax.random.key(0))
    grads = jax.tree.map(lambda x: 0.01 + 1e-3 * jnp.arange(x.size, dtype=x.dtype).reshape(
        x.shape) / x.size, params)  # not constant: Muon's orthogonalisation must see a matrix

    def updates(name, lr_base_width):
        t = _train(optimizer=name, lr_base_width=lr_base_width, b1=0.9, b2=0.95)
        opt = optimizer.make_optimizer(t, model.d_model)
        state, p, out = opt.init(params), params, []
        for _ in range(2):
            u, state = opt.update(grads, state, p)
            p = jax.tree.map(jnp.add, p, u)
            out += jax.tree.leaves(u)
        return out

    def same(a, b):
        return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))

    assert same(updates("muon", 0), updates("muon", 16))
    assert not same(updates("adamw", 0), updates("adamw", 16))

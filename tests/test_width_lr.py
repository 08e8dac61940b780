"""The width rule (train.lr_base_width, train/width_lr.py): each parameter's learning rate is
the one the rule states, read off the optimizer's own update; at lr_base_width == d_model
training is bitwise unchanged; the ladders resolve with the rule on."""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ModelConfig, base_config, validate
from transformer.model.gpt import init_params
from transformer.scaling import sweep as scaling
from transformer.train import optimizer, width_lr
from transformer.lab import lr_transfer
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
    """Every member of every AdamW ladder config carries the rule (the ladders' default), and
    its optimizer builds at the member's own width with the stated multiplier. The ladders on
    the quick start's recipe give the blocks' matrices to Muon, whose orthogonalised step
    needs no width rule: theirs is off (a multiplier of 1), and their optimizer builds too."""
    members = scaling.members(_sweep(name))
    assert len(LADDERS) >= 7
    widths = {m.config.train.lr_base_width for m in members}
    muon = members[0].config.train.optimizer == "muon"
    assert len(widths) == 1 and (widths.pop() == 0 if muon else widths.pop() > 0)
    for m in members[:3]:
        t, d = m.config.train, m.config.model.d_model
        assert width_lr.multiplier(t, d) == (1.0 if muon else t.lr_base_width / d)
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


def _fake_member(workdir, name, d_model, steps, per_step, val_loss, val_bpb=None):
    """A finished sweep member as report.collect reads it: result.json and a metrics line."""
    run = workdir / name
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps(dict(
        name=name, index=0, budget="chinchilla", budget_value=4, n_layers=d_model // 32,
        d_model=d_model, steps=steps, tokens=steps * per_step, params_total=1,
        params_non_embedding=d_model, flops=1.0, wall_s=1.0, group="g")))
    line = {"step": steps, "val_loss": val_loss}
    if val_bpb is not None:
        line["val_bpb"] = val_bpb
    (run / "metrics.jsonl").write_text(json.dumps(line) + "\n")


# Final val bits per byte of a fake depth sweep: each depth's best at x1, depth 3's curve
# flatter; depth 3 lacks x4 (a sweep still running).
DEPTH_BPB = {2: {0.5: 2.30, 1.0: 2.20, 2.0: 2.40, 4.0: 2.90},
             3: {0.5: 2.05, 1.0: 2.00, 2.0: 2.02}}


def test_the_depth_lr_transfer_table_and_figure_mark_each_depths_lowest_loss(tmp_path):
    """`lr_transfer --depth` reads nats per byte (val_bpb × ln 2), bolds and stars the lowest
    loss of each depth (not the highest), and prints the cost of one multiplier for all."""
    shapes = {2: (64, 265, 1024), 3: (96, 438, 2048)}
    for depth, curve in DEPTH_BPB.items():
        for x, bpb in curve.items():
            _fake_member(tmp_path, f"lrx{x:g}_D{depth}_x4", *shapes[depth], 9.9, bpb)
    data, got_shapes, unit = lr_transfer.depth_losses(tmp_path)
    assert unit == "nats per byte" and got_shapes == shapes
    assert data[2][1.0] == pytest.approx(2.20 * np.log(2))
    rows = lr_transfer.depth_table(data, shapes).splitlines()
    assert rows[0].split(" | ")[3:] == ["x0.5", "x1", "x2", "x4", "best |"]
    for depth, row in zip((2, 3), rows[2:4]):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:3] == [str(depth), str(shapes[depth][0]), f"{shapes[depth][1]:,} × "
                             f"{shapes[depth][2]:,}"]
        assert cells[-1] == "x1"
        assert [c for c in cells if c.startswith("**")] == \
            [f"**{DEPTH_BPB[depth][1.0] * np.log(2):.4f}**"]
    assert rows[3].split(" | ")[6] == "-"  # depth 3 has no x4
    excess = [c.strip() for c in rows[4].strip("|").split("|")][3:7]
    assert excess == [f"{0.10 * np.log(2):+.4f}", "+0.0000", f"{0.20 * np.log(2):+.4f}", "-"]

    out = tmp_path / "depth.png"
    lr_transfer.depth_figure(data, shapes, unit, out)
    assert out.stat().st_size > 0
    fig, ax = lr_transfer._pyplot().subplots()
    lr_transfer.draw(ax, [(f"depth {d}", c) for d, c in data.items()], "x")
    stars = [line.get_xdata().tolist() for line in ax.lines if line.get_marker() == "*"]
    assert stars == [[1.0], [1.0]]


def test_the_depth_table_says_nats_per_token_without_val_bpb(tmp_path):
    _fake_member(tmp_path, "lrx1_D2_x4", 64, 265, 1024, 3.5)
    data, _, unit = lr_transfer.depth_losses(tmp_path)
    assert unit == "nats per token" and data == {2: {1.0: 3.5}}


def test_the_width_lr_transfer_table_still_reads_its_sweep(tmp_path):
    """The width figure's tables (configs/scaling/lr_transfer.py) through the shared helpers:
    the best lr per rule and width, the base width's twin filled in under the rule, and the
    worst excess of one lr over every width's best."""
    losses = {(0, 16): {0.01: 3.0, 0.02: 2.9}, (0, 32): {0.01: 2.7, 0.02: 2.8},
              (16, 32): {0.01: 2.75, 0.02: 2.6}}
    for (w, d), curve in losses.items():
        for lr, loss in curve.items():
            _fake_member(tmp_path, f"lr_base_width={w}_lr={lr:g}_L{d // 16}-d{d}_x4", d, 10,
                         128, loss)
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": {"variants": [
        {"train.lr_base_width": 0}, {"train.lr_base_width": 16}]}}))
    data, widths, rule = lr_transfer.losses(tmp_path)
    assert widths == [16, 32] and rule == 16 and data[(16, 16)] == losses[(0, 16)]
    rows = lr_transfer.table(data, widths, rule).splitlines()[2:]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["0.02", "0.01", "0.02", "0.02"]
    assert "**2.6000**" in rows[3] and "**2.7500**" not in rows[3]
    assert lr_transfer.one_lr(data, widths, rule).splitlines()[3] == "| lr_base_width=16 | " \
        "+0.1500 | +0.0000 |"

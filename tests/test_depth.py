"""model.depth (config/depth.py): the sizes, rates, batch, decay and steps one number derives
follow the written rules, computed here again from the rules' text (the parameter count from
model/flops.py, not from depth.py)."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from transformer.config import ConfigError, ModelConfig, depth, replace, validate
from transformer.model import flops

ROOT = Path(__file__).resolve().parents[1]


def _config(name):
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", ROOT / "configs" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _matrices(config) -> int:
    """N by flops.py: the matmul weights less the head (vocab_size 0 in these configs: none)."""
    c = ModelConfig.from_config(config)
    return flops.matmul_weights(c) - c.vocab_size * c.d_model


def _at(config, n):
    return validate(depth.derive(validate(replace(config, **{"model.depth": n}))))


@pytest.mark.parametrize("name", ["default.py", "tiny.py"])
def test_each_depth_follows_the_written_rules(name):
    ref = validate(_config(name))
    m0, t0 = ref.model, ref.train
    n0 = _matrices(ref)
    head = m0.d_model // m0.n_heads
    for n in range(1, 9):
        c = _at(ref, n)
        m, t = c.model, c.train
        # 1. shape: the reference's aspect ratio and head width, its d_ff / d_model
        assert m.n_layers == n and m.d_model // m.n_heads == head
        assert m.d_model == math.ceil(m0.d_model / m0.n_layers * n / head) * head
        assert m.d_ff * m0.d_model == m0.d_ff * m.d_model
        # 2-3. horizon D = ratio x N; batch: the reference's times 2^round(log2((D/D0)^0.383))
        N = _matrices(c)
        b = t.batch_size / t0.batch_size
        assert b == 2.0 ** round(0.383 * math.log2(N / n0)), n
        # 4. rates: every group x sqrt(B/B0); AdamW's (muon: embedding, head, norms) x sqrt(d0/d)
        if t0.optimizer == "muon":
            assert t.muon_lr == pytest.approx(t0.muon_lr * math.sqrt(b))
            assert t.lr == pytest.approx(t0.lr * math.sqrt(b) * math.sqrt(m0.d_model / m.d_model))
        else:  # the hidden matrices by the width rule, tuned at the reference's width
            assert t.lr == pytest.approx(t0.lr * math.sqrt(b))
            assert t.lr_base_width == (t0.lr_base_width or m0.d_model)
        # 5. decay x sqrt(B/B0) x D0/D; 6. steps = D / B
        for key in ("weight_decay", "muon_weight_decay"):
            assert t[key] == pytest.approx(t0[key] * math.sqrt(b) * n0 / N)
        assert t.steps == max(1, round(t0.tokens_per_param * N / (t.batch_size * m.max_seq_len)))


def test_without_a_ratio_the_steps_are_as_given_and_nothing_else_changes():
    """The batch and decay rules read D/D0 = N/N0 only: tokens_per_param=0 (a sweep's budget
    sets the steps) derives the same sizes, rates, batch and decays."""
    ref = validate(_config("default.py"))
    for n in (2, 6):
        with_ratio = _at(ref, n).to_dict()
        given = _at(replace(ref, **{"train.tokens_per_param": 0.0}), n).to_dict()
        assert given["train"].pop("steps") == ref.train.steps
        with_ratio["train"].pop("steps")
        given["train"]["tokens_per_param"] = with_ratio["train"]["tokens_per_param"]
        assert given == with_ratio


def test_the_reference_depth_gives_the_config_back_and_deriving_twice_changes_nothing():
    """The config as written is the reference: at its own depth only the steps follow the
    horizon rule. A derived config is its own reference (a resumed run derives it again)."""
    ref = validate(_config("default.py"))
    same = _at(ref, ref.model.n_layers).to_dict()
    want = ref.to_dict()
    want["model"]["depth"] = ref.model.n_layers
    want["train"]["steps"] = same["train"]["steps"]
    assert same == want
    for n in (2, 3, 7):
        once = _at(ref, n)
        assert depth.derive(once).to_dict() == once.to_dict()
    assert depth.derive(ref) is ref  # depth 0: the sizes as given


def test_a_run_resolves_its_depth_once_where_it_resolves_its_config():
    from transformer.train.resolve import resolve
    c = _config("default.py")
    c.model.depth = 6
    resolved, _ = resolve(c)
    assert (resolved.model.n_layers, resolved.model.d_model, resolved.model.n_heads) == (6, 192, 6)
    assert c.model.d_model == 128  # the caller's config is left as it is
    assert ModelConfig.from_config(resolved).d_model == 192


def test_a_depth_that_cannot_keep_the_kv_groups_is_one_error():
    c = _config("default.py")
    c.model.update(n_heads=4, n_kv_heads=2)
    with pytest.raises(ConfigError, match="model.depth=3: 3 heads cannot keep K/V groups of 2"):
        _at(validate(c), 3)
    c.model.depth = -1
    with pytest.raises(ConfigError, match="model.depth=-1"):
        validate(c)


def test_the_depth_ladder_members_differ_only_by_depth():
    from transformer.scaling.sweep import members
    sweep = _config("scaling/depth_ladder.py")
    assert all(set(size) == {"name", "depth"} for size in sweep.sizes)
    runs = members(sweep)
    assert [r.config.model.n_layers for r in runs] == [s["depth"] for s in sweep.sizes]
    base = validate(sweep.base)
    for r in runs:  # the depth's own derivation, then the sweep's budget sets the steps
        want = _at(base, r.config.model.n_layers)
        assert r.config.model.d_model == want.model.d_model
        assert r.config.train.muon_lr == want.train.muon_lr
        assert r.config.train.batch_size == want.train.batch_size
        # the budget's steps, which the member's run keeps (tokens_per_param=0)
        assert r.config.model.depth == r.config.model.n_layers
        assert r.config.train.tokens_per_param == 0
        assert depth.derive(r.config).to_dict() == r.config.to_dict()


def test_sizes_prints_what_a_depth_derives():
    out = subprocess.run([sys.executable, "-m", "transformer", "sizes",
                          "--config=configs/default.py", "--config.model.depth=6"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("depth 6 derives") and "d_model 192, 6 heads, d_ff 384" in line
    assert "steps of 32 x 128" in line

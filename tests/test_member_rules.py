"""Every sweep member at its own settings (transformer/scaling/rules.py): the written rules
hold, reproduce their reference, agree with the depth dial's, and reach the members."""

import importlib.util
import math
from pathlib import Path

import pytest

from transformer.config import depth, replace, validate
from transformer.config.files import quick_start
from transformer.model import flops
from transformer.model.sizes import model_config_of
from transformer.scaling import rules
from transformer.scaling import sweep as scaling

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs/scaling" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_gets_its_own_settings_back():
    ref = quick_start()
    got = rules.settings(ref, ref.model.d_model, rules.reference_tokens(ref))
    t = ref.train
    assert got["train.batch_size"] == t.batch_size and got["train.steps"] == t.steps
    assert got["train.warmup_steps"] == t.warmup_steps
    for key in ("lr", "muon_lr", "weight_decay", "muon_weight_decay"):
        assert got[f"train.{key}"] == pytest.approx(t[key]), key


@pytest.mark.parametrize("d_model, tokens", [(8, 1e5), (32, 7e5), (128, 1.2e6), (128, 3e7),
                                             (256, 2e8)])
def test_each_rule_holds_where_it_is_stretched(d_model, tokens):
    """Batch a power of two times the reference's, following D^0.383 to within one doubling;
    η ∝ √B, AdamW's ∝ 1/√d besides; each group's decay timescale 1/(ηλ) the same fraction
    of the run's steps; warm-up the same fraction of the steps."""
    ref = quick_start()
    t, d0, D0 = ref.train, ref.model.d_model, rules.reference_tokens(ref)
    got = rules.settings(ref, d_model, tokens)
    B, S = got["train.batch_size"], got["train.steps"]
    assert math.log2(B / t.batch_size) == round(math.log2(B / t.batch_size))
    assert abs(math.log2(B / t.batch_size) - 0.383 * math.log2(tokens / D0)) <= 0.5
    assert S == max(1, round(tokens / (B * ref.model.max_seq_len)))
    root = math.sqrt(B / t.batch_size)
    assert got["train.muon_lr"] == pytest.approx(t.muon_lr * root)
    assert got["train.lr"] == pytest.approx(t.lr * root * math.sqrt(d0 / d_model))
    assert got["train.muon_lr"] * got["train.muon_weight_decay"] * S == pytest.approx(
        t.muon_lr * t.muon_weight_decay * t.steps)
    assert got["train.lr"] * got["train.weight_decay"] * S == pytest.approx(
        t.lr * t.weight_decay * t.steps)
    assert got["train.warmup_steps"] == max(1, round(t.warmup_steps / t.steps * S))


def test_the_rules_are_the_depth_dials_fed_the_members_tokens():
    """A depth member trained on tokens_per_param × its matrices (the horizon the depth dial
    assumes) gets the depth dial's batch and rates from the rules too."""
    ref = quick_start()
    n0 = depth.matrices(128, 4, 4, 0, 256, "swiglu")
    ref = replace(ref, **{"train.steps": round(12 * n0 / (16 * 128))})  # D₀ = 12·N₀
    for L in (2, 3, 6, 8):
        derived = depth.derive(validate(replace(ref, **{"model.depth": L,
                                                        "train.tokens_per_param": 12})))
        m = derived.model
        tokens = 12 * depth.matrices(m.d_model, m.n_layers, m.n_heads, 0, m.d_ff, m.mlp)
        got = rules.settings(ref, m.d_model, tokens)
        assert got["train.batch_size"] == derived.train.batch_size, L
        assert got["train.muon_lr"] == pytest.approx(derived.train.muon_lr), L
        assert got["train.lr"] == pytest.approx(derived.train.lr), L
        assert got["train.muon_weight_decay"] == pytest.approx(
            derived.train.muon_weight_decay, rel=0.02), L  # whole steps round D/B


def test_a_sweep_with_rules_gives_each_member_its_own_settings():
    """configs/scaling/cpu_isoflop_rules.py: every member carries the rules' settings for its
    width and tokens; the window (tokens per compute-equivalent parameter) keeps 5 or more
    sizes a budget, all inside it, the half-steps inside their own narrower one; the rules
    off, every member has the base's batch."""
    iso = _load("cpu_isoflop_rules")
    sweep = iso.get_config()
    members = scaling.members(sweep)
    for budget in iso.BUDGETS:
        assert sum(m.value == budget for m in members) >= 5, budget
    for m in members:
        model = model_config_of(m.config)
        F = flops.train_flops_per_token(model)
        half_step = m.config.model.d_model in iso.HALF_STEPS
        low, high = iso.HALF_STEP_WINDOW if half_step else iso.WINDOW
        assert low * 0.98 <= m.tokens / (F / 6) <= high * 1.02, m.name
        got = rules.settings(sweep.base, m.config.model.d_model, m.value / F)
        for key, value in got.items():
            section, name = key.split(".")
            assert m.config[section][name] == pytest.approx(value), (m.name, key)
    assert len({m.config.train.batch_size for m in members}) > 1
    sweep.rules = False
    assert {m.config.train.batch_size for m in scaling.members(sweep)} == \
        {sweep.base.train.batch_size}


def test_the_rate_check_scales_both_rates_at_both_corners():
    check = _load("cpu_rate_check")
    for corner in ("small", "large"):
        ruled = scaling.members(check.get_config(f"{corner},rules,seeds=2"))
        fixed = scaling.members(check.get_config(f"{corner},fixed"))
        assert len(ruled) == 6 and len(fixed) == 3
        x1 = [m for m in ruled if m.name.startswith("x1_")][0].config.train
        for m in ruled:
            mult = float(m.name.split("_")[0][1:])
            assert m.config.train.muon_lr == pytest.approx(x1.muon_lr * mult)
            assert m.config.train.lr == pytest.approx(x1.lr * mult)
        assert {m.config.train.warmup_steps for m in fixed} == {20}

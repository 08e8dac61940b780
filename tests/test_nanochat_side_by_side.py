"""transformer/lab/nanochat_side_by_side.py: its pure pieces (nanochat's size and rate rules,
the sweep's choice, Welch's p, the units, the record) and the skip line without a checkout.
The side by side itself needs a nanochat checkout and minutes of quiet CPU; with one named by
the NANOCHAT environment variable, a 3-second end-to-end smoke runs it too."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from transformer.data import prepare as prep

TOOL = ROOT / "transformer" / "lab" / "nanochat_side_by_side.py"


@functools.cache
def _tool():
    spec = importlib.util.spec_from_file_location("nanochat_side_by_side", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_nanochat_checkout_it_skips_in_one_line(tmp_path):
    for args in ([], [f"--nanochat={tmp_path}"]):
        done = subprocess.run([sys.executable, "-m", "transformer.lab.nanochat_side_by_side",
                               *args], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("skipped: "), done.stdout


# Three seeds a side; hand-computed Welch (unequal variances) for "ours lower":
#   means 1.1643 and 1.3561, sample variances 0.0043² and 0.0125², n = 3 each:
#   se² = (0.0043² + 0.0125²) / 3, t = -0.1918 / se = -25.131;
#   Welch-Satterthwaite df = se⁴ / ((0.0043²/3)² / 2 + (0.0125²/3)² / 2) = 2.4668;
#   p = Student t(df).cdf(t) = 2.454e-4 (pooled variances, df 4, would give 7.44e-6).
OURS, THEIRS = [1.1600, 1.1643, 1.1686], [1.3436, 1.3561, 1.3686]


def _p(ours, theirs):
    return _tool().summary(ours, [1.0] * len(ours), theirs, [1.0] * len(theirs), 1.0, {},
                           "a CPU")["p_value"]


def test_the_summarys_p_is_welchs_one_sided_with_unequal_variances():
    from scipy import stats
    va, vb = 0.0043**2, 0.0125**2  # the samples' variances (ddof 1), by hand
    se2 = va / 3 + vb / 3
    t = (sum(OURS) / 3 - sum(THEIRS) / 3) / math.sqrt(se2)
    df = se2**2 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    by_hand = float(stats.t.cdf(t, df))
    assert t == pytest.approx(-25.131, abs=1e-3) and df == pytest.approx(2.4668, abs=1e-4)
    assert by_hand == pytest.approx(2.454e-4, rel=1e-3)
    got = _p(OURS, THEIRS)
    assert got == pytest.approx(by_hand, rel=1e-6)
    pooled = float(stats.ttest_ind(OURS, THEIRS, alternative="less").pvalue)
    assert abs(pooled - by_hand) > 10 * abs(got - by_hand) + 1e-5  # a pooled version fails
    assert _p(THEIRS, OURS) == pytest.approx(1 - by_hand, rel=1e-6)  # one-sided
    assert _p([1.0], THEIRS) is None  # one seed: no test


def test_the_summary_has_the_keys_the_last_line_promises():
    s = _tool().summary(OURS, [77.0, 78.0, 76.0], THEIRS, [77.1, 77.0, 77.2], 2.0,
                        {0.5: 1.4, 1.0: 1.36, 2.0: 1.3561, 4.0: float("nan")}, "a CPU")
    assert json.loads(json.dumps(s, allow_nan=False)) == s  # strict JSON: no NaN
    assert s["ours"]["val_losses"] == OURS and s["nanochat"]["wall_s"] == [77.1, 77.0, 77.2]
    assert s["nanochat"]["lr_multiplier"] == 2.0 and s["cpu"] == "a CPU"
    assert s["sweep"] == {"0.5": 1.4, "1": 1.36, "2": 1.3561, "4": None}
    assert s["ratio"] == pytest.approx(1.1643 / 1.3561, rel=1e-9)
    assert s["ours"]["spread"] == pytest.approx(0.0086) and \
        s["ours"]["std"] == pytest.approx(0.0043)
    assert s["p_value"] == _p(OURS, THEIRS)


def test_the_best_multiplier_is_the_lowest_finite_loss():
    best = _tool().best_multiplier
    assert best({0.25: 1.30, 0.5: 1.25, 1.0: 1.21, 2.0: 1.22}) == 1.0
    assert best({1.0: 1.5, 2.0: float("nan"), 4.0: 1.4}) == 4.0  # a diverged run never wins
    assert best({1.0: 1.2, 2.0: 1.2}) == 1.0  # a tie: the smaller
    with pytest.raises(SystemExit):
        best({1.0: float("nan")})


def test_nats_per_byte_uses_the_sets_validation_tokens_per_byte(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "é中 text " * (i + 3))
    prep.prepare([docs], tmp_path / "set", shard_tokens=300)
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    val = manifest["splits"]["val"]
    # byte tokens: one per UTF-8 byte, plus an end-of-text token per document
    assert val["tokens"] > val["bytes"] > 0
    from transformer.lab import nanogpt_side_by_side as nanogpt
    assert nanogpt.tokens_per_byte(tmp_path / "set") == val["tokens"] / val["bytes"]


def test_nanochats_size_and_rate_rules(tmp_path):
    t = _tool()
    assert t.nanochat_shape(4, 32, 64) == (128, 2)  # the quick start's 4 × 128, heads of 64
    assert t.nanochat_shape(20, 64, 128) == (1280, 10)  # base_train's default d20
    assert t.nanochat_shape(3, 50, 64) == (192, 3)  # rounded up to whole heads
    script = tmp_path / "base_train.py"
    script.write_text('import argparse\np = argparse.ArgumentParser()\n'
                      'p.add_argument("--matrix-lr", type=float, default=0.03, help="x")\n'
                      'p.add_argument("--eval-tokens", type=int, default=80*524288)\n')
    rules = t.base_train_defaults(script)
    assert rules["matrix_lr"] == 0.03 and rules["embedding_lr"] == 0.3  # read, else fallback
    rates = t.nanochat_rates(rules, 2048, 1000, 21000, batch_lr_scale=True)
    assert rates["matrix_lr"] == pytest.approx(0.03 / 16)  # √(2048 / 2¹⁹) = 1/16
    assert rates["weight_decay"] == pytest.approx(0.28 / 16 * 21)  # λ·√(B/B_ref)·D_ref/D
    assert t.nanochat_rates(rules, 2048, 1000, 21000, False)["matrix_lr"] == 0.03
    n = 200  # warmup 40 steps, constant to step 70, warmdown over the last 130 (65%)
    lrs = [t.lr_factor(i, n, rules) for i in range(n + 1)]
    assert lrs[0] == 1 / 40 and lrs[39] == 1.0 and lrs[70] == 1.0 > lrs[71]
    assert lrs[n] == pytest.approx(0.05) and lrs[135] == pytest.approx(0.525)  # linear
    # Muon's momentum: its 400-step warmup wins over the warmdown (as in base_train)
    assert t.muon_momentum(0, n, rules) == 0.85 and t.muon_momentum(n, n, rules) == \
        pytest.approx(0.91)
    assert t.muon_momentum(1000, 1000, rules) == pytest.approx(0.90)
    assert t.muon_momentum(500, 2000, rules) == 0.97 > t.muon_momentum(701, 2000, rules)


def test_a_summary_becomes_one_record_line(tmp_path):
    from transformer.lab import records
    s = _tool().summary(OURS, [77.0, 78.0, 76.0], THEIRS, [77.1, 77.0, 77.2], 2.0,
                        {1.0: 1.36, 2.0: 1.3561}, "a CPU")
    rec = _tool().as_record(s, [0, 1, 2], ["--nanochat=x"], 2, "nanochat in float32")
    records.append(tmp_path / "side_by_side.jsonl", rec)
    [back] = records.read(tmp_path / "side_by_side.jsonl")
    assert back["seeds"] == [0, 1, 2] and back["machine"] == {"cpu": "a CPU", "cores": 2,
                                                               **records.versions()}
    assert back["result"]["ours_val_loss"] == 1.1643 and back["result"]["loss_ratio"] == 0.859
    assert back["result"]["nanochat_seed2"] == 1.3686 and back["result"]["sweep_x1"] == 1.36
    assert back["command"].endswith("--nanochat=x") and "float32" in back["note"]


NANOCHAT = os.environ.get("NANOCHAT")


@pytest.mark.skipif(not NANOCHAT or not (Path(NANOCHAT) / "nanochat" / "gpt.py").is_file(),
                    reason="no nanochat checkout named by NANOCHAT")
def test_end_to_end_smoke(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-m", "transformer.lab.nanochat_side_by_side",
         f"--nanochat={NANOCHAT}", "--budget_s=3", "--seeds=0", "--lr_multipliers=1,2",
         "--ours=--config.train.steps=5", f"--work={tmp_path / 'work'}",
         f"--record={tmp_path / 'rec.jsonl'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=1200,
        env=dict(os.environ, TRANSFORMER_CACHE=str(tmp_path / "unused")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(s["ours"]["val_losses"]) == len(s["nanochat"]["val_losses"]) == 1
    assert set(s["sweep"]) == {"1", "2"} and s["p_value"] is None
    assert all(0 < v < 10 for v in s["nanochat"]["val_losses"])
    from transformer.lab import records
    assert len(records.read(tmp_path / "rec.jsonl")) == 1

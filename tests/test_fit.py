"""The compute-optimal fitters recover constants planted in synthetic sweeps: losses drawn
from a known L(N, D) (plus noise), at known FLOP budgets, must give back alpha, beta, E and
the optimal-allocation exponents that follow from them in closed form."""

import math

import numpy as np
import pytest

from transformer.scaling import chinchilla

TRUE = dict(E=1.7, A=400.0, alpha=0.34, B=410.0, beta=0.28)


def _isoflop_runs(budgets, noise=0.0, seed=0, per_budget=9):
    """An IsoFLOP sweep with C = 6·N·D: at each budget, N spread over 1.5 decades around
    the true optimum, D = C / 6N, loss from TRUE times (1 + noise·ε)."""
    rng = np.random.default_rng(seed)
    runs = []
    for C in budgets:
        n_opt, _ = _true_optimum(C)
        for N in n_opt * np.geomspace(0.18, 5.5, per_budget):
            D = C / (6 * N)
            loss = chinchilla.loss_nd(TRUE, N, D) * (1 + noise * rng.standard_normal())
            runs.append(dict(C=C, N=N, D=D, loss=float(loss)))
    return runs


def _true_optimum(C):
    """Hoffmann et al.'s closed form for C = 6ND: N_opt = G (C/6)^(β/(α+β))."""
    a, b = TRUE["alpha"], TRUE["beta"]
    G = (a * TRUE["A"] / (b * TRUE["B"])) ** (1 / (a + b))
    return G * (C / 6) ** (b / (a + b)), (C / 6) ** (a / (a + b)) / G


BUDGETS = [1e17, 1e18, 1e19, 1e20]


def test_approach3_recovers_exponents_and_entropy_from_noisy_losses():
    fit = chinchilla.approach3(_isoflop_runs(BUDGETS, noise=0.003))
    assert fit["alpha"] == pytest.approx(TRUE["alpha"], abs=0.05)
    assert fit["beta"] == pytest.approx(TRUE["beta"], abs=0.05)
    assert fit["E"] == pytest.approx(TRUE["E"], abs=0.1)


def test_approach3_is_exact_without_noise():
    fit = chinchilla.approach3(_isoflop_runs(BUDGETS))
    for name in ("alpha", "beta", "E"):
        assert fit[name] == pytest.approx(TRUE[name], rel=2e-2), name


def test_approach2_recovers_the_allocation_exponents():
    """a = β/(α+β), b = α/(α+β): the parabolas' minima follow the true optimum."""
    fit = chinchilla.approach2(_isoflop_runs(BUDGETS, noise=0.0005))
    a_true = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])
    assert fit["a"] == pytest.approx(a_true, abs=0.04)
    assert fit["b"] == pytest.approx(1 - a_true, abs=0.04)
    assert fit["a"] + fit["b"] == pytest.approx(1.0, abs=0.02)  # C = 6ND exactly here


def test_approach2_on_planted_parabolas_gives_their_exponent():
    """Valleys placed exactly at N_opt = 3·C^0.6 come back with a = 0.6 and k_N = 3."""
    runs = []
    for C in (1e10, 1e11, 1e12):
        n_opt = 3 * C ** 0.6
        for N in n_opt * np.geomspace(0.1, 10, 5):
            runs.append(dict(C=C, N=N, D=C / (6 * N), loss=2 + 0.3 * math.log(N / n_opt) ** 2))
    fit = chinchilla.approach2(runs)
    assert fit["a"] == pytest.approx(0.6, abs=1e-9)
    assert fit["kN"] == pytest.approx(3.0, rel=1e-6)
    assert fit["b"] == pytest.approx(0.4, abs=1e-9)


def test_approach3_optimum_matches_the_closed_form():
    runs = _isoflop_runs(BUDGETS)
    cost = chinchilla.PowerLawCost(runs)  # C = 6ND here, so k N^p is exact: p = 1, k = 6
    assert cost.p == pytest.approx(1.0) and cost.k == pytest.approx(6.0)
    n_opt, d_opt, _ = chinchilla.approach3_optimum(TRUE, 1e21, cost)
    n_true, d_true = _true_optimum(1e21)
    assert n_opt == pytest.approx(n_true, rel=1e-3)
    assert d_opt == pytest.approx(d_true, rel=1e-3)


def test_bootstrap_intervals_cover_the_truth_and_shrink_with_less_noise():
    widths = []
    for noise in (0.01, 0.002):
        runs = _isoflop_runs(BUDGETS, noise=noise, seed=1, per_budget=7)
        full = chinchilla.approach3(runs)
        _, fits3 = chinchilla.bootstrap(runs, n=20, approach3_fit=full)
        lo, hi = chinchilla.interval([f["alpha"] for f in fits3])
        assert lo <= TRUE["alpha"] <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0]


def test_a_budget_without_a_valley_is_left_out():
    runs = _isoflop_runs(BUDGETS[:3])
    runs += [dict(C=5e20, N=N, D=1e9, loss=3.0 - 0.01 * i)  # falling: no minimum
             for i, N in enumerate((1e8, 2e8, 4e8))]
    assert 5e20 not in chinchilla.approach2(runs)["budgets"]


def test_approach2_leaves_budgets_whose_minimum_is_outside_the_sizes_out_of_its_fit():
    """Valleys at N_opt = 3·C^0.6 inside the sizes at three budgets, and one budget whose
    valley lies 30x beyond its largest size: reported (inside=False), not fitted."""
    runs = []
    for C, beyond in ((1e10, 1), (1e11, 1), (1e12, 1), (1e13, 30)):
        n_opt = 3 * C ** 0.6
        for N in n_opt / beyond * np.geomspace(0.1, 10, 5):
            runs.append(dict(C=C, N=N, D=C / (6 * N), loss=2 + 0.3 * math.log(N / n_opt) ** 2))
    fit = chinchilla.approach2(runs)
    assert len(fit["budgets"]) == 4 and len(fit["fitted"]) == 3
    assert [b["inside"] for b in fit["budgets"].values()] == [True, True, True, False]
    assert fit["a"] == pytest.approx(0.6, abs=1e-9) and fit["kN"] == pytest.approx(3.0, rel=1e-6)


@pytest.mark.parametrize("config", ["cpu_isoflop.py", "cpu_isoflop_gpt2.py"])
def test_prediction_uses_the_real_flop_count_of_the_ladder(config):
    """A planted sweep whose cost is the real one: every member of a CPU IsoFLOP config (the
    quick start's block: 4 layers, widths 12..192, BPE 2,048, an untied head, members kept by
    a tokens-per-parameter window; GPT-2's: 2 layers, widths 8..96, BPE 1,024), each trained on
    the tokens the sweep gives it, with losses from a known L(N, D) in compute-equivalent N
    (the GPT-2 sweep's fitted constants). At 100x the largest budget the prediction equals a brute-force minimisation of
    the true law over every width of the ladder, with D = C / (its counted training FLOPs per
    token), to 1%. (The old cost, F = k·N^p fitted to the runs, put N_opt 2.7x too high.)"""
    import importlib.util
    import json
    from pathlib import Path

    import ml_collections

    from transformer.model import flops
    from transformer.model.sizes import model_config_of
    from transformer.scaling import isoflop
    from transformer.scaling import sweep as scaling
    path = Path(__file__).resolve().parents[1] / "configs/scaling" / config
    spec = importlib.util.spec_from_file_location("isoflop_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sweep = module.get_config()
    truth = dict(E=0.52, A=12.1, alpha=0.175, B=168.0, beta=0.337)
    runs = []
    for m in scaling.members(sweep):
        model = model_config_of(m.config)
        N, D = flops.train_flops_per_token(model) / 6, m.tokens  # compute-equivalent N
        runs.append(dict(C=flops.train_flops_per_token(model) * D, budget=m.value, N=N, D=D,
                         loss=float(chinchilla.loss_nd(truth, N, D)), name=m.name))
    fits = isoflop.fit_all(runs, n_boot=0, sweep=json.loads(sweep.to_json()))
    C = 100 * max(sweep.budgets)
    n_opt, d_opt, loss = chinchilla.approach3_optimum(fits["a3"], C, fits["cost"])

    first = sweep.sizes[0]
    base = ml_collections.ConfigDict(sweep.base.to_dict())
    best = None
    for width in range(4, 2049):  # every width: the FLOPs do not depend on the head count
        base.model.update(n_layers=first["n_layers"], d_model=width, n_heads=1,
                          d_ff=first["d_ff"] // first["d_model"] * width)
        model = model_config_of(base)
        N = flops.train_flops_per_token(model) / 6
        D = C / flops.train_flops_per_token(model)
        L = float(chinchilla.loss_nd(truth, N, D))
        if best is None or L < best[2]:
            best = (N, D, L)
    assert n_opt == pytest.approx(best[0], rel=0.01)
    assert d_opt == pytest.approx(best[1], rel=0.01)
    assert loss == pytest.approx(best[2], rel=1e-4)
    assert fits["a2"] is not None and len(fits["a2"]["fitted"]) >= 3


def test_a_budget_with_too_few_finished_sizes_is_not_called_a_budget_without_a_valley():
    """A sweep still running (or with failed members): at the largest budget only 2 of 9
    sizes have finished, on a law whose every budget has a valley. No parabola fits 2
    points, and the report said "no valley: loss does not turn up within the sizes tried",
    a statement about the losses that they do not support. It says why it is left out."""
    from transformer.scaling import isoflop
    runs = _isoflop_runs(BUDGETS)
    runs = [r for r in runs if r["C"] < BUDGETS[-1]] + [r for r in runs if r["C"] == BUDGETS[-1]][:2]
    for r in runs:
        r["name"] = "run"
    fits = isoflop.fit_all(runs, n_boot=0)
    [row] = [line for line in isoflop.describe(fits)  # Approach 2's table: 6 columns
             if line.startswith("| 1e+20") and line.count("|") == 7]
    assert "no valley" not in row and "fewer than 3 sizes" in row, row
    assert len(fits["a2"]["fitted"]) == 3


def test_the_report_names_what_it_leaves_out_and_uses_one_sign_convention():
    """A budget without a valley is a row saying so (it used to vanish); fewer fitted
    resamples than asked are counted; the implied exponent is written once; the holdout's
    two error columns share one sign (predicted - actual)."""
    import re

    from transformer.scaling import isoflop
    runs = _isoflop_runs(BUDGETS[:3], noise=0.003, per_budget=5)
    runs += [dict(C=5e20, N=N, D=1e9, loss=3.0 - 0.01 * i)  # falling: no minimum
             for i, N in enumerate((1e8, 2e8, 4e8))]
    for r in runs:
        r.setdefault("name", f"run{id(r)}")
    fits = isoflop.fit_all(runs, n_boot=6)
    text = "\n".join(isoflop.describe(fits))
    assert re.search(r"\| 5e\+20 \| - .*no valley", text), text
    fitted = len(fits["boot2"])
    assert (f"[{fitted} of 6 resamples" in text) if fitted < 6 else "[6 resamples]" in text
    [implied] = [line for line in text.splitlines() if line.startswith("implied")]
    assert re.fullmatch(r"implied N_opt ∝ C\^a, a = β/\(α\+β\) = [\d.]+ \[[\d.]+, [\d.]+\]",
                        implied), implied
    fits["boot2"] = fits["boot2"][:3]
    assert "[3 of 6 resamples; 3 could not be fitted" in "\n".join(isoflop.describe(fits))

    held = [dict(r, loss=r["loss"] * 1.05) for r in _isoflop_runs([1e20], per_budget=5)]  # all above the law
    for r in held:
        r["name"] = "held"
    table = isoflop.holdout_lines(_isoflop_runs(BUDGETS[:3], noise=0.003, per_budget=5) + held, "largest",
                                  n_boot=4)
    assert any("predicted - actual" in line for line in table)
    for line in table:
        if line.startswith("| held"):
            error_pct, error_hw = (float(x) for x in line.strip("| ").split(" | ")[-2:])
            assert error_pct < 0 and error_hw < 0  # predicted lower than actual: both negative


def _mixed_axis_runs():
    """A sweep planted on compute-equivalent parameters (C = 6·N·D exactly), each run also
    carrying a non-embedding count that leaves out a head growing as √N: 30% of N at the
    smallest budget's optimum, a few % at the largest, as the 2,048-row head is of
    cpu_isoflop.py's widths."""
    k = 0.3 * math.sqrt(_true_optimum(BUDGETS[0])[0])
    return [dict(r, N_non_embedding=r["N"] - k * math.sqrt(r["N"]), N_total=r["N"] * 1.1,
                 budget=r["C"], name="run") for r in _isoflop_runs(BUDGETS, per_budget=9)]


def test_a_mixed_n_axis_makes_a_plus_b_drift_and_the_warning_fire():
    """Fitted on the N the FLOP count counts, a + b = 1 and nothing is said; fitted on
    non-embedding parameters (the head in C, not in N) the sum drifts past 0.05 and the
    report warns, naming the axis."""
    from transformer.scaling import isoflop
    runs = _mixed_axis_runs()
    right = chinchilla.approach2(runs)
    assert abs(right["a"] + right["b"] - 1) < 0.01 and chinchilla.sum_warning(right) is None
    mixed = chinchilla.approach2([dict(r, N=r["N_non_embedding"]) for r in runs])
    assert mixed["a"] + mixed["b"] - 1 > 0.05
    assert chinchilla.sum_warning(mixed).startswith("WARNING: a + b = ")
    text = "\n".join(isoflop.axes_lines(runs))
    assert "non-embedding: WARNING: a + b" in text
    assert "compute-equivalent C/(6D): WARNING" not in text


def _offset_runs(offsets, noise=0.002, seed=1):
    """A planted sweep whose every run of budget i sits offsets[i] nats off the law."""
    rng = np.random.default_rng(seed)
    runs = []
    for C, shift in zip(BUDGETS, offsets):
        for r in _isoflop_runs([C], per_budget=7):
            runs.append(dict(r, budget=C, loss=r["loss"] + shift + noise * rng.standard_normal()))
    return runs


def test_approach3_is_trusted_only_when_it_fits():
    """Seed-noise-sized scatter: the gate passes. Offsets by budget (+-0.03 nats, alternating,
    so the rmse alone stays under 3x a 0.012 noise): the gate fails on the one-sign budgets, and
    says so. A gate with the sign test turned around (fail on mixed signs, pass on one sign)
    fails both halves. A holdout below 80% inside fails it too; predictions then come from
    Approach 2."""
    from transformer.scaling import gate, isoflop
    clean = _offset_runs([0, 0, 0, 0])
    verdict = gate.judge(clean, chinchilla.approach3(clean), seed_noise=0.003)
    assert verdict["fits"], verdict["reasons"]
    shifted = _offset_runs([0.03, -0.03, 0.03, -0.03])
    a3 = chinchilla.approach3(shifted)
    verdict = gate.judge(shifted, a3, seed_noise=0.012)
    assert verdict["rmse"] < 3 * 0.012  # not caught by the rmse
    assert not verdict["fits"] and any("has one sign" in r for r in verdict["reasons"])
    assert sum(one for _, _, one in verdict["budgets"].values()) >= 2
    assert "Approach 3 does not fit: every residual of budget" in "\n".join(
        gate.lines(verdict, 0.012, False))
    assert not gate.judge(clean, chinchilla.approach3(clean), 0.003, holdout_inside=0.5)["fits"]
    fits = isoflop.fit_all(shifted, n_boot=0, sweep={"seed_noise": 0.012})
    p = isoflop.optimum(fits, 1e21)
    assert p["source"] == "Approach 2"
    assert p["N"] == pytest.approx(chinchilla.approach2_optimum(fits["a2"], 1e21)[0])


def test_the_published_sweep_refits_as_its_record_says():
    """The refit of cpu_isoflop.py's 29 recorded members (transformer/lab/isoflop_refit.py)
    gives the exponents its record in docs/records/scaling.jsonl holds, on every N."""
    import json

    from transformer.lab import isoflop_refit
    recorded = [json.loads(line)["result"] for line in isoflop_refit.RECORDS.read_text()
                .splitlines() if "isoflop_refit scaling/cpu_isoflop.py" in line][-1]
    _, figures = isoflop_refit.refit("scaling/cpu_isoflop.py", 0.01, n_boot=2)
    for key in ("runs", "a", "b", "a_plus_b", "a_non_embedding", "a_plus_b_non_embedding",
                "a_total", "tokens_per_param_opt", "approach3_rmse", "approach3_budget_means"):
        assert figures[key] == recorded[key], key
    assert recorded["approach3_fits"].startswith("no: ")


def _minima(losses, budgets=(1e11, 1e12, 1e13, 1e14, 1e15)):
    """An Approach 2 result holding only what min_loss_law reads: each budget's minimum."""
    return dict(fitted=list(budgets),
                budgets={C: dict(loss_opt=float(L)) for C, L in zip(budgets, losses)})


def test_the_minimum_loss_law_finds_a_floor_and_keeps_a_power_law_a_power_law():
    """Minima planted on E + A·C^-α give back E and α; minima on a pure power law k·C^g
    give E = 0 and its slope (the power law is one of the fits); with three budgets E = 0
    (three constants through three points would fit anything). A law that ignored the floor
    (E = 0 on the first plant) would miss the planted loss at 100x the largest budget."""
    budgets = np.array([1e11, 1e12, 1e13, 1e14, 1e15])
    floored = 1.8 + 40.0 * budgets ** -0.15
    E, A, alpha = chinchilla.min_loss_law(_minima(floored))
    assert E == pytest.approx(1.8, abs=0.02) and alpha == pytest.approx(0.15, rel=0.05)
    far = 1.8 + 40.0 * 1e17 ** -0.15
    assert chinchilla.min_loss_at((E, A, alpha), 1e17) == pytest.approx(far, rel=2e-3)
    slope, log_k = np.polyfit(np.log(budgets), np.log(floored), 1)
    assert abs(math.exp(log_k) * 1e17 ** slope - far) / far > 0.01  # the floorless law misses
    power = 9.0 * budgets ** -0.05
    E, A, alpha = chinchilla.min_loss_law(_minima(power))
    assert E == 0 and alpha == pytest.approx(0.05) and A == pytest.approx(9.0)
    E, _, _ = chinchilla.min_loss_law(_minima(floored[:3], budgets[:3]))
    assert E == 0
    assert chinchilla.min_loss_law(_minima(floored[:1], budgets[:1])) is None


def test_the_within_budget_bootstrap_keeps_each_budgets_runs_and_covers_the_truth():
    """Resamples drawn within each budget keep every budget's run count and give an interval
    on a that covers the planted β/(α+β)."""
    runs = [dict(r, budget=r["C"]) for r in _isoflop_runs(BUDGETS, noise=0.004, seed=3)]
    fits = chinchilla.bootstrap_within_budgets(runs, n=40, seed=0)
    assert len(fits) >= 38
    lo, hi = chinchilla.interval([f["a"] for f in fits])
    truth = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])
    assert lo < truth < hi and hi - lo < 0.2

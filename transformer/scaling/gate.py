"""Whether Approach 3 fits a sweep well enough to predict from: its residuals against the
recipe's seed noise, budget by budget, and on a held-out budget.

    verdict = gate.judge(runs, a3, seed_noise=0.01, holdout_inside=0.83)
    verdict["fits"], verdict["reasons"], verdict["budgets"]

A smooth L(N, D) = E + A/N^α + B/D^β spreads noise across every run; what it cannot make is an
offset shared by a whole budget (settings fixed in steps, not in tokens, make exactly that).
So Approach 3 is trusted only when none of these holds (each, when it does, is a reason):

1. its rmse (loss minus fit, nats) exceeds 3 × the recipe's seed noise (sweep.seed_noise: the
   standard deviation of one run's final val loss over seeds); not judged when unknown;
2. a budget of 3 or more runs has residuals that all share one sign, and their mean exceeds
   the seed noise (a sign pattern of noise-sized residuals is noise itself; 0.001 nats, a
   tenth of this project's CPU seed noise, when the noise is unknown);
3. fitted without the largest budget, fewer than 80% of that budget's runs fall inside their
   95% bootstrap intervals (`--holdout=largest`; not judged without it).

When it does not fit, the report says so and why, and predictions come from Approach 2
(isoflop.optimum): N_opt = k·C^a, D = C / F(N), the loss from E + A·C^(−α) through each
budget's minimum loss (chinchilla.min_loss_law).
"""

from __future__ import annotations

import math

import numpy as np

from transformer.scaling import chinchilla

RMSE_TIMES_NOISE = 3.0
MIN_OFFSET = 1e-3  # nats: a budget offset below this is numerical, whatever the seed noise
HOLDOUT_INSIDE = 0.8


def residuals(runs, a3: dict) -> dict:
    """{budget: [measured - fitted loss, nats, per run]}, budgets in increasing order."""
    out = {}
    for r in sorted(runs, key=lambda r: (r.get("budget", r["C"]), r["N"])):
        fitted = float(chinchilla.loss_nd(a3, r["N"], r["D"]))
        out.setdefault(r.get("budget", r["C"]), []).append(r["loss"] - fitted)
    return out


def judge(runs, a3: dict | None, seed_noise: float | None = None,
          holdout_inside: float | None = None) -> dict:
    """{"fits": bool, "reasons": [one line each], "rmse": nats, "budgets": {budget: (mean
    residual, runs, all one sign)}} for Approach 3's fit `a3` of `runs` (see the module doc).
    `holdout_inside`: the fraction of the held-out budget's runs inside their intervals."""
    if a3 is None:
        return dict(fits=False, reasons=["Approach 3 could not be fitted (needs >= 6 runs "
                                         "with 3 sizes and 3 token counts)"],
                    rmse=math.nan, budgets={})
    by_budget = residuals(runs, a3)
    every = np.concatenate([np.array(v, float) for v in by_budget.values()])
    rmse = float(np.sqrt(np.mean(every ** 2)))
    budgets, reasons = {}, []
    for budget, values in by_budget.items():
        values = np.array(values, float)
        one_sign = len(values) >= 3 and (bool((values > 0).all()) or bool((values < 0).all()))
        budgets[budget] = (float(values.mean()), len(values), one_sign)
    if seed_noise and rmse > RMSE_TIMES_NOISE * seed_noise:
        reasons.append(f"its rmse, {rmse:.4f} nats, is more than {RMSE_TIMES_NOISE:g}x the "
                       f"recipe's seed noise ({seed_noise:.4f})")
    offset = [(b, m) for b, (m, _, one) in budgets.items()
              if one and abs(m) > max(seed_noise or 0.0, MIN_OFFSET)]
    if offset:
        reasons.append("every residual of budget " + ", ".join(
            f"{b:.2g} (mean {m:+.4f})" for b, m in offset) + " has one sign: offsets by "
            "budget, which E + A/N^α + B/D^β cannot make")
    if holdout_inside is not None and holdout_inside < HOLDOUT_INSIDE:
        reasons.append(f"fitted without the largest budget, {100 * holdout_inside:.0f}% of "
                       f"its runs fall inside their 95% intervals (< {100 * HOLDOUT_INSIDE:.0f}%)")
    return dict(fits=not reasons, reasons=reasons, rmse=rmse, budgets=budgets)


def lines(verdict: dict, seed_noise: float | None, holdout_judged: bool,
          noise_source: str | None = None) -> list[str]:
    """Markdown: each budget's mean residual, then whether Approach 3 fits, and why not."""
    out = ["Approach 3's residuals (measured minus fitted loss, nats) by budget:", "",
           "| budget C | runs | mean residual | all one sign |", "|---|---:|---:|---|"]
    for b, (mean, n, one) in verdict["budgets"].items():
        out.append(f"| {b:.2g} | {n} | {mean:+.4f} | {'yes' if one else 'no'} |")
    noise = (f"{seed_noise:.4f}" + (f", {noise_source}" if noise_source else "")
             if seed_noise else "unknown (sweep.seed_noise not set)")
    out += ["", f"rmse {verdict['rmse']:.4f} nats; the recipe's seed noise {noise}"
            + ("" if holdout_judged else "; holdout not checked (--holdout=largest)")]
    if verdict["fits"]:
        out.append("Approach 3 fits: predictions use it")
    else:
        out.append("Approach 3 does not fit: " + "; ".join(verdict["reasons"])
                   + ". Predictions use Approach 2.")
    return out

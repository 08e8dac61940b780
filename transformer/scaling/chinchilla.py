"""Compute-optimal scaling from IsoFLOP sweeps: Chinchilla's approaches 2 and 3, each
constant with a bootstrap interval (Hoffmann et al. 2022, sections 3.2 and 3.3).

    from transformer import chinchilla
    runs = [dict(C=..., N=..., D=..., loss=...), ...]     # one per finished sweep member
    a2 = chinchilla.approach2(runs)     # per-budget parabolas -> N_opt ∝ C^a, D_opt ∝ C^b
    a3 = chinchilla.approach3(runs)     # L(N, D) = E + A/N^alpha + B/D^beta
    chinchilla.bootstrap(runs, n=200)   # both again on runs resampled with replacement

Approach 2: at each budget C, loss against log N is a valley; a parabola through it puts the
minimum at N_opt(C) (and one against log D at D_opt(C)). Straight lines through
(log C, log N_opt) and (log C, log D_opt) give the exponents a and b; with C ∝ N·D they
must add up to 1.

Approach 3: the parametric loss, fitted as Hoffmann et al. did: minimise the Huber loss
(δ = 1e-3) between log L̂ = LSE(a - α log N, b - β log D, e) and log L over a grid of
starting points with L-BFGS (A = e^a, B = e^b, E = e^e). N and D are divided by their
geometric means inside the fit, which keeps the start grid small; A and B are returned for
raw N and D.

Compute of a run is its counted training FLOPs, not 6·N·D: at these sizes the output head
and attention FLOPs matter (with a 1024-token vocabulary the head costs more than the blocks
below d_model 32). So the tokens a budget C buys at size N are D = C / F(N), with F(N) the
training FLOPs per token of the ladder's model of that size (isoflop.LadderCost counts them
with flops.train_flops_per_token), and Approach 3's optimum at C is the N minimising
L(N, C / F(N)). (A power law k·N^p fitted to the runs' C/D, as used before, has p ≈ 0.69 on
the CPU ladder, where the head dominates; extrapolated to larger models it underestimates
F(N) by 1.6x at 1.6M and 3.2x at 25M non-embedding parameters, and N_opt and D_opt with it.
It is kept only as the fallback when the ladder is unknown.)

Approach 2 fits its power laws on the budgets whose parabola's minimum lies inside the
sizes tried; a minimum outside them is an extrapolation of the parabola, reported but left
out of the fit. Each budget's C is its runs' counted FLOPs (their geometric mean: whole
steps make them differ by well under 1%), not the nominal budget.

Intervals: resample the runs with replacement, refit, and take the 2.5th and 97.5th
percentiles of each constant (a 95% percentile bootstrap).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from transformer.scaling import fit

HUBER_DELTA = 1e-3
# 2^5 starting points; with N and D scaled to ~1, A/N^alpha at the geometric-mean size is
# e^a, so a, b in {-2, 0.5} span terms of ~0.1 to ~2 nats.
_START = dict(alpha=(0.25, 0.75), beta=(0.25, 0.75), a=(-2.0, 0.5), b=(-2.0, 0.5),
              e=(-0.5, 1.0))


def _arrays(runs, *keys):
    return [np.array([float(r[k]) for r in runs]) for k in keys]


def parabola_minimum(x, y):
    """(x at the minimum of the least-squares parabola y ≈ c2 x² + c1 x + c0, its coefficients),
    or None when the points do not make a valley (c2 <= 0) or are too few."""
    if len(set(np.round(x, 12))) < 3:
        return None
    c2, c1, c0 = np.polyfit(x, y, 2)
    if c2 <= 0:
        return None
    return -c1 / (2 * c2), (c2, c1, c0)


def approach2(runs) -> dict | None:
    """Per-budget minima and the power laws N_opt = k_N C^a, D_opt = k_D C^b, fitted on the
    budgets whose minimum lies inside the sizes tried (`fitted`: those budgets); None unless
    at least two budgets have such a valley. Runs are grouped by their `budget` (the nominal
    one the sweep sized them to; `C` when absent); C of a budget is its runs' counted FLOPs.
    `no_valley` lists the budgets left out because their loss has no minimum in log N (it
    falls or rises across the sizes tried); `too_few` those with fewer than 3 distinct sizes
    finished (no parabola can be fitted: a sweep still running, or members that failed)."""
    budgets, no_valley, too_few = {}, [], []
    groups = {}
    for r in runs:
        groups.setdefault(r.get("budget", r["C"]), []).append(r)
    for budget, at in sorted(groups.items()):
        N, D, loss, counted = _arrays(at, "N", "D", "loss", "C")
        C = float(np.exp(np.mean(np.log(counted))))
        logN, logD = np.log(N), np.log(D)
        if len(set(np.round(logN, 12))) < 3:
            too_few.append(C)
            continue
        n_min, d_min = parabola_minimum(logN, loss), parabola_minimum(logD, loss)
        if n_min is None or d_min is None or max(abs(n_min[0]), abs(d_min[0])) > 700:
            no_valley.append(C)  # or one so flat its vertex overflows exp (a resample)
            continue
        budgets[C] = dict(budget=budget, N_opt=math.exp(n_min[0]), D_opt=math.exp(d_min[0]),
                          loss_opt=float(np.polyval(n_min[1], n_min[0])), parabola=n_min[1],
                          inside=bool(logN.min() <= n_min[0] <= logN.max()))
    fitted = [C for C, b in budgets.items() if b["inside"]]
    if len(fitted) < 2:
        return None
    logC = np.log(fitted)
    a, log_kN = np.polyfit(logC, np.log([budgets[C]["N_opt"] for C in fitted]), 1)
    b, log_kD = np.polyfit(logC, np.log([budgets[C]["D_opt"] for C in fitted]), 1)
    if not (np.isfinite([a, b]).all() and max(abs(log_kN), abs(log_kD)) < 700):
        return None
    return dict(budgets=budgets, fitted=fitted, a=float(a), b=float(b), kN=math.exp(log_kN),
                kD=math.exp(log_kD), no_valley=no_valley, too_few=too_few)


SUM_TOLERANCE = 0.05  # |a + b - 1| beyond this: N and the FLOP count disagree


def sum_warning(f: dict | None) -> str | None:
    """A warning when Approach 2's a + b is more than SUM_TOLERANCE from 1. With C = 6·N·D
    exactly, N_opt·D_opt = C/6 at every budget and a + b = 1; a sum off 1 says the N fitted is
    not the N the FLOP count counts (non-embedding parameters against a C that includes the
    head: Pearce & Song 2024, Porian et al. 2024), and a is biased by the difference."""
    if not f or abs(f["a"] + f["b"] - 1) <= SUM_TOLERANCE:
        return None
    return (f"WARNING: a + b = {f['a'] + f['b']:.3f}, more than {SUM_TOLERANCE} from 1: the N "
            "fitted is not the N the FLOP count C counts (C != 6·N·D), and a is biased; fit "
            "on compute-equivalent parameters C/(6D)")


MIN_LOSS_BUDGETS = 4  # budgets the saturating law needs (3 constants and one to spare)


def min_loss_law(f: dict | None):
    """(E, A, α) of L_opt(C) = E + A·C^(−α) through the fitted budgets' minimum losses of
    Approach 2 (its parabolas' lowest points); None with fewer than 2. The loss a prediction
    stands on when Approach 3 does not fit (scaling/gate.py). A loss cannot fall below the
    data's entropy, so the minima approach a floor E (Hoffmann et al. 2022's L(C) at the
    optimum has this form),
    where a pure power law k·C^g (the rule before, E = 0) walks down a straight line in
    log-log forever. E is chosen on a grid of 400 values in [0, 0.99·the lowest minimum)
    (E = 0 included: the power law is one of the fits), A and α by least squares of
    log(L − E) on log C at each, keeping the E whose fitted losses miss the minima least
    (squared error in log L). With fewer than MIN_LOSS_BUDGETS budgets E = 0: three
    constants through three points would fit anything."""
    if not f or len(f["fitted"]) < 2:
        return None
    C = np.array(f["fitted"], float)
    loss = np.array([f["budgets"][c]["loss_opt"] for c in f["fitted"]], float)
    if not (loss > 0).all():
        return None
    floors = np.linspace(0.0, 0.99 * loss.min(), 400) if len(C) >= MIN_LOSS_BUDGETS \
        else np.zeros(1)
    best = None
    for E in floors:
        slope, log_a = np.polyfit(np.log(C), np.log(loss - E), 1)
        fitted = E + math.exp(log_a) * C ** slope
        err = float(np.sum((np.log(fitted) - np.log(loss)) ** 2))
        if best is None or err < best[0]:
            best = (err, float(E), math.exp(log_a), float(-slope))
    return best[1:]


def min_loss_at(law, C: float) -> float:
    """L_opt(C) = E + A·C^(−α) of min_loss_law; nan without a law."""
    if law is None:
        return math.nan
    E, A, alpha = law
    return E + A * C ** -alpha


def approach2_optimum(f: dict, C: float):
    """(N_opt, D_opt) at budget C from Approach 2's power laws."""
    return f["kN"] * C ** f["a"], f["kD"] * C ** f["b"]


def _huber(r, delta=HUBER_DELTA):
    abs_r = np.abs(r)
    return np.where(abs_r <= delta, 0.5 * r ** 2, delta * (abs_r - 0.5 * delta))


def _objective(p, logN, logD, logL):
    """The Huber loss of the log-loss residuals and its gradient in (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = p
    terms = np.stack([a - alpha * logN, b - beta * logD, np.full_like(logN, e)])
    # log-sum-exp over the three terms, shifted by their max to stay finite; written out
    # (not scipy's logsumexp) because the fits call this tens of thousands of times
    top = terms.max(0)
    exp_terms = np.exp(terms - top)
    total = exp_terms.sum(0)
    pred = top + np.log(total)
    r = pred - logL
    w = exp_terms / total  # d pred / d term: the softmax of the three terms
    dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)  # the Huber loss's derivative
    grad = np.array([np.sum(dr * w[0]), np.sum(dr * w[1]), np.sum(dr * w[2]),
                     -np.sum(dr * w[0] * logN), -np.sum(dr * w[1] * logD)])
    return float(np.sum(_huber(r))), grad


def approach3(runs, starts=None) -> dict | None:
    """L(N, D) = E + A/N^alpha + B/D^beta by Huber-on-log-loss with L-BFGS from every start;
    None with fewer than 6 runs or fewer than 3 distinct N or D (fit.identifiable)."""
    N, D, L = _arrays(runs, "N", "D", "loss")
    if not fit.identifiable(N, D):
        return None
    sN, sD = np.exp(np.mean(np.log(N))), np.exp(np.mean(np.log(D)))
    logN, logD, logL = np.log(N / sN), np.log(D / sD), np.log(L)
    if starts is None:
        starts = [(a, b, e, al, be) for al, be, a, b, e in itertools.product(
            _START["alpha"], _START["beta"], _START["a"], _START["b"], _START["e"])]
    best = None
    # L-BFGS-B's step on 5 parameters calls BLAS on tiny arrays; a multi-threaded OpenBLAS
    # (numpy's, one thread per core) hands each call to its threads and waits for them: 12x
    # slower on 2 vCPUs (2.3 s against 0.19 s for one fit), the same numbers bit for bit.
    with warnings.catch_warnings(), threadpool_limits(1, user_api="blas"):
        warnings.simplefilter("ignore", RuntimeWarning)
        for p0 in starts:
            res = minimize(_objective, np.array(p0, float), args=(logN, logD, logL),
                           method="L-BFGS-B", jac=True,
                           bounds=[(-20, 20), (-20, 20), (-5, 5), (0, 3), (0, 3)])
            if best is None or res.fun < best.fun:
                best = res
    a, b, e, alpha, beta = best.x
    return dict(E=math.exp(e), A=math.exp(a) * sN ** alpha, alpha=float(alpha),
                B=math.exp(b) * sD ** beta, beta=float(beta), objective=float(best.fun),
                start=tuple(float(v) for v in best.x), scales=(float(sN), float(sD)))


def loss_nd(f: dict, N, D):
    return f["E"] + f["A"] * np.asarray(N, float) ** -f["alpha"] + \
        f["B"] * np.asarray(D, float) ** -f["beta"]


class PowerLawCost:
    """FLOPs per token ≈ k·N^p fitted to the runs' C/D: the fallback cost when the sweep's
    ladder is unknown (no sweep.json). Wrong far from the runs' sizes (see the module doc)."""

    n_range = (1e2, 1e13)

    def __init__(self, runs):
        N, D, C = _arrays(runs, "N", "D", "C")
        p, log_k = np.polyfit(np.log(N), np.log(C / D), 1)
        self.k, self.p = math.exp(log_k), float(p)

    def __call__(self, N):
        return self.k * np.asarray(N, float) ** self.p


def approach3_optimum(f: dict, C: float, cost):
    """(N_opt, D_opt, loss) at budget C: the N minimising L(N, C / cost(N)) over
    cost.n_range, on a fine grid in log N refined by a parabola through the best grid point
    and its neighbours. `cost(N)`: training FLOPs per token of the model with N non-embedding
    parameters (isoflop.LadderCost, or PowerLawCost)."""
    lo, hi = cost.n_range
    logN = np.linspace(math.log(lo), math.log(hi), 4001)
    N = np.exp(logN)
    L = loss_nd(f, N, C / cost(N))
    i = int(np.clip(np.argmin(L), 1, len(N) - 2))
    found = parabola_minimum(logN[i - 1:i + 2], L[i - 1:i + 2])
    n_opt = math.exp(found[0]) if found else float(N[i])
    n_opt = min(max(n_opt, lo), hi)
    d_opt = C / float(cost(n_opt))
    return n_opt, d_opt, float(loss_nd(f, n_opt, d_opt))


def bootstrap(runs, n: int = 100, seed: int = 0, approach3_fit: dict | None = None):
    """Refits of both approaches on `n` resamples of the runs (with replacement); a resample
    that cannot be fitted is dropped. Approach 3 restarts from the full fit's optimum and a
    few grid points, not the whole grid, to keep `n` refits affordable."""
    rng = np.random.default_rng(seed)
    starts = None
    if approach3_fit is not None:
        grid = list(itertools.product(_START["a"], _START["b"], _START["e"],
                                      _START["alpha"], _START["beta"]))
        starts = [approach3_fit["start"]] + [grid[i] for i in
                                             rng.choice(len(grid), 2, replace=False)]
    fits2, fits3 = [], []
    for _ in range(n):
        sample = [runs[i] for i in rng.integers(0, len(runs), len(runs))]
        f2, f3 = approach2(sample), approach3(sample, starts)
        if f2 is not None:
            fits2.append(f2)
        if f3 is not None:
            fits3.append(f3)
    return fits2, fits3


def bootstrap_within_budgets(runs, n: int = 100, seed: int = 0) -> list[dict]:
    """Approach 2 refitted on `n` resamples drawn within each budget (each budget keeps its
    number of runs, drawn with replacement from its own): the design's budgets and sizes fixed,
    only the losses' noise resampled. A diagnostic beside `bootstrap`, whose resamples across
    all runs also move runs between budgets (a budget drawn with too few sizes drops out)."""
    rng = np.random.default_rng(seed)
    groups = {}
    for r in runs:
        groups.setdefault(r.get("budget", r["C"]), []).append(r)
    fits = []
    for _ in range(n):
        sample = [g[i] for g in groups.values() for i in rng.integers(0, len(g), len(g))]
        f = approach2(sample)
        if f is not None:
            fits.append(f)
    return fits


def interval(values, level: float = 0.95):
    """The percentile interval (lo, hi) of bootstrap values; (nan, nan) when there are none."""
    values = np.asarray([v for v in values if np.isfinite(v)], float)
    if len(values) == 0:
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))

"""The compute-optimal part of a sweep report: IsoFLOP fits, predictions, a holdout check, and
a run that checks a prediction.

    python -m transformer scaling --workdir=runs/isoflop --report                 # + isoflop.md
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=1e15
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop --verify      # train the prediction

Works on the report's rows (one per finished member of an IsoFLOP sweep). N is the
compute-equivalent parameter count C/(6D): the N the FLOP count agrees with (C = 6·N·D
exactly), the untied head and attention included. Counting non-embedding parameters instead
while C counts the head bends N_opt ∝ C^a away from the truth at small scale (0.72 against
0.50 on cpu_isoflop.py's runs): the mechanism of Pearce & Song 2024, "Reconciling Kaplan and
Chinchilla scaling laws", and Porian et al. 2024, "Resolving discrepancies in compute-optimal
scaling". Chinchilla counted all parameters; here that is 0.47 on the same runs, as the
embedding table costs no FLOPs. The other counts stay as columns (`N_AXES`), with Approach 2's
a + b on each. D is the training tokens, C the run's counted training FLOPs
(`budget`, the nominal budget it was sized to, groups Approach 2's parabolas); the loss is the
final validation loss in nats per token. The tokens a budget buys at size N come from the
sweep's own ladder rule and FLOP count (`LadderCost`), not from a fit. The math is in
chinchilla.py.
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from transformer.config import ConfigError
from transformer.model import flops
from transformer.model.sizes import human, model_config_of
from transformer.scaling import chinchilla, gate, plot


# What N can mean: (label, key of runs_of's dicts); the fits use the first.
N_AXES = (("compute-equivalent C/(6D)", "N"), ("non-embedding", "N_non_embedding"),
          ("all parameters", "N_total"))


def runs_of(rows) -> list[dict]:
    return [dict(C=r["flops"], budget=r["budget_value"], N=r["flops"] / (6 * r["tokens"]),
                 N_non_embedding=r["params_non_embedding"], N_total=r["params_total"],
                 D=r["tokens"], loss=r["val_loss"], name=r["name"])
            for r in rows if math.isfinite(r["val_loss"])]


def axes_lines(runs) -> list[str]:
    """Markdown: Approach 2's a, b and a + b with N counted each way of N_AXES, the sum's
    warning under each that misses 1 by more than chinchilla.SUM_TOLERANCE."""
    lines = ["N counted three ways (Approach 2 on each; the fits use the first, the N the FLOP "
             "count agrees with):", "", "| N | a (N_opt ∝ C^a) | b (D_opt ∝ C^b) | a + b |",
             "|---|---:|---:|---:|"]
    warnings = []
    for label, key in N_AXES:
        if any(key not in r for r in runs):
            continue
        f = chinchilla.approach2([dict(r, N=r[key]) for r in runs])
        if f is None:
            lines.append(f"| {label} | - | - | - |")
            continue
        lines.append(f"| {label} | {f['a']:.3f} | {f['b']:.3f} | {f['a'] + f['b']:.3f} |")
        warning = chinchilla.sum_warning(f)
        if warning:
            warnings.append(f"{label}: {warning}")
    return lines + ([""] + warnings if warnings else [])


def ladder_shapes(sweep: dict) -> list[dict]:
    """Every size the sweep's ladder rule makes: for a fixed-depth ladder (every size the same
    depth) any width in steps of 4 with heads of at most the ladder's head dim; otherwise
    d_model = aspect·L with the ladder's head dim, L = 1..128. d_ff = the ladder's ratio."""
    sizes = sweep["sizes"]
    size0 = sizes[0]
    mlp_ratio = size0["d_ff"] // size0["d_model"]
    if len(sizes) > 1 and len({s["n_layers"] for s in sizes}) == 1:
        L = size0["n_layers"]
        head_dim = max(s["d_model"] // s["n_heads"] for s in sizes)
        shapes = [(L, d, -(-d // head_dim)) for d in range(4, 8193, 4)]
        shapes = [(L, d, h) for L, d, h in shapes if not d % h]
    else:
        aspect = size0["d_model"] // size0["n_layers"]
        head_dim = size0["d_model"] // size0["n_heads"]
        shapes = [(L, aspect * L, aspect * L // head_dim) for L in range(1, 129)
                  if not aspect * L % head_dim]
    return [dict(name=f"L{L}-d{d}", n_layers=L, d_model=d, n_heads=h, d_ff=mlp_ratio * d)
            for L, d, h in shapes]


class LadderCost:
    """Training FLOPs per token F(N) along the sweep's ladder rule (N compute-equivalent,
    F/6, so F(N) = 6N at every ladder size), counted for each of its
    sizes by flops.train_flops_per_token on the model the sweep would build (its base config,
    the BPE or byte vocabulary, context, head, attention), so D(N, C) = C / F(N) is the real
    number of tokens budget C buys. Between two ladder sizes F is interpolated in log-log
    (smooth: F is a quadratic in the width); `nearest(N)` is the ladder size to train."""

    def __init__(self, sweep: dict):
        self.base = ml_collections.ConfigDict(sweep["base"])
        self.sizes, points = [], []
        kv_heads = self.base.model.get("n_kv_heads", 0)
        for size in ladder_shapes(sweep):
            if kv_heads and size["n_heads"] % kv_heads:
                continue  # grouped-query attention needs whole groups: the base cannot build it
            points.append(self.count(size))
            self.sizes.append(size)
        order = np.argsort([n for n, _ in points])
        self.sizes = [self.sizes[i] for i in order]
        self.N = np.array([points[i][0] for i in order], float)
        self.F = np.array([points[i][1] for i in order], float)
        self.n_range = (float(self.N[0]), float(self.N[-1]))

    def count(self, size: dict) -> tuple[float, int]:
        """(compute-equivalent params F/6, training FLOPs per token F) of `size` on the
        sweep's base: the N of runs_of, so the fits' N maps back to a size."""
        model = self._model(size)
        F = flops.train_flops_per_token(model)
        return F / 6, F

    def non_embedding(self, size: dict) -> int:
        return flops.param_counts(self._model(size))["non_embedding"]

    def _model(self, size: dict):
        config = ml_collections.ConfigDict(self.base.to_dict())
        config.model.update({k: v for k, v in size.items() if k != "name"}, matmul="plain")
        return model_config_of(config)

    def __call__(self, N):
        return np.exp(np.interp(np.log(N), np.log(self.N), np.log(self.F)))

    def _index(self, N: float) -> int:
        return int(np.argmin(np.abs(np.log(self.N) - math.log(N))))

    def nearest(self, N: float) -> tuple[dict, float, float]:
        """(the ladder size nearest N in log space, its N, its F): the size that --predict
        names and --verify trains."""
        i = self._index(N)
        return self.sizes[i], float(self.N[i]), float(self.F[i])

    def neighbours(self, N: float, factor: float = 2.0) -> list[dict]:
        """The ladder sizes nearest N/factor and N·factor (the next size where that lands on
        the size nearest N), smaller first; one only at an end of the ladder. At 2x: by the
        measured curvature of an IsoFLOP valley a 2x miss in N costs 0.09-0.15 nats, where one
        sweep step (~1.5x in N) is too close to the optimum to tell apart from seed noise."""
        i = self._index(N)
        out = []
        for direction in (-1, 1):
            j = self._index(self.N[i] * factor ** direction)
            if j == i:
                j = i + direction
            if 0 <= j < len(self.sizes):
                out.append(self.sizes[j])
        return out


def cost_of(sweep: dict | None, runs):
    """The sweep's LadderCost; without a sweep.json (runs written by hand) the old fallback,
    a power law fitted to the runs' C/D (approximate away from their sizes)."""
    if sweep and sweep.get("sizes") and sweep.get("base"):
        return LadderCost(sweep)
    return chinchilla.PowerLawCost(runs)


def fit_all(runs, n_boot: int = 100, sweep: dict | None = None,
            holdout_inside: float | None = None,
            measured_noise: tuple[float, int] | None = None) -> dict:
    """Both approaches on all runs, their bootstrap refits, the FLOPs-per-token cost, and
    whether Approach 3 fits (gate.judge, against the seed noise and the holdout's coverage
    when known). The seed noise is `measured_noise` ((nats, members), report.seed_noise:
    from the sweep's members trained at 2 or more seeds) where given, else the sweep's
    assumed seed_noise."""
    a2, a3 = chinchilla.approach2(runs), chinchilla.approach3(runs)
    fits2, fits3 = chinchilla.bootstrap(runs, n_boot, approach3_fit=a3) if a3 or a2 else ([], [])
    noise = measured_noise[0] if measured_noise else (sweep or {}).get("seed_noise")
    source = (f"measured over the seeds of {measured_noise[1]} members" if measured_noise
              else "assumed (sweep.seed_noise)" if noise else None)
    return dict(a2=a2, a3=a3, boot2=fits2, boot3=fits3, n_boot=n_boot,
                cost=cost_of(sweep, runs), seed_noise=noise, seed_noise_source=source,
                gate=gate.judge(runs, a3, noise, holdout_inside),
                holdout_judged=holdout_inside is not None)


def _resamples(fitted: list, asked: int) -> str:
    """How many bootstrap resamples the interval stands on, and how many could not be fitted."""
    if len(fitted) == asked:
        return f"[{asked} resamples]"
    return (f"[{len(fitted)} of {asked} resamples; {asked - len(fitted)} could not be fitted "
            "(no valley, or too few distinct sizes drawn) and are left out]")


def _pm(value, values, fmt=".3g"):
    lo, hi = chinchilla.interval(values)
    return f"{format(value, fmt)} [{format(lo, fmt)}, {format(hi, fmt)}]"


def describe(fits) -> list[str]:
    """Markdown lines: each constant with its 95% bootstrap interval."""
    a2, a3, b2, b3 = fits["a2"], fits["a3"], fits["boot2"], fits["boot3"]
    asked = fits.get("n_boot", max(len(b2), len(b3)))
    lines = ["### Compute-optimal fits (95% bootstrap intervals over runs)", "",
             "N is compute-equivalent parameters C/(6D) (the head and attention included)", ""]
    if a2:
        lines += ["Approach 2 (a parabola of loss in log N per budget):", "",
                  "| budget C | N_opt | D_opt | D_opt/N_opt | loss at the minimum | minimum inside the sizes |",
                  "|---|---|---|---|---|---|"]
        for C, b in a2["budgets"].items():
            lines.append(f"| {C:.2g} | {human(b['N_opt'])} | {human(b['D_opt'])} "
                         f"| {b['D_opt'] / b['N_opt']:.3g} | {b['loss_opt']:.4f} "
                         f"| {'yes' if b['inside'] else 'NO (extrapolated: not fitted)'} |")
        for C in a2.get("no_valley", []):
            lines.append(f"| {C:.2g} | - | - | - | - | no valley: loss does not turn up "
                         "within the sizes tried; left out of the fit |")
        for C in a2.get("too_few", []):
            lines.append(f"| {C:.2g} | - | - | - | - | fewer than 3 sizes finished: no "
                         "parabola; left out of the fit |")
        left_out = [C for C in a2["budgets"] if C not in a2["fitted"]]
        if left_out:
            lines += ["", f"The power laws below use {len(a2['fitted'])} of "
                      f"{len(a2['budgets'])} budgets: the minimum at "
                      + ", ".join(f"C = {C:.2g}" for C in left_out)
                      + " lies outside the sizes tried, an extrapolation of its parabola."]
        lines += ["", f"N_opt ∝ C^a, a = {_pm(a2['a'], [f['a'] for f in b2])}; "
                  f"D_opt ∝ C^b, b = {_pm(a2['b'], [f['b'] for f in b2])}; "
                  f"a + b = {_pm(a2['a'] + a2['b'], [f['a'] + f['b'] for f in b2])} "
                  f"(1 if C = 6·N·D)   {_resamples(b2, asked)}", ""]
        warning = chinchilla.sum_warning(a2)
        if warning:
            lines += [warning, ""]
    else:
        lines += ["Approach 2: needs at least two budgets whose loss has a valley in log N, "
                  "with its minimum inside the sizes tried", ""]
    if a3:
        lines.append("Approach 3: L(N, D) = E + A/N^α + B/D^β; "
                     + ", ".join(f"{k} = {_pm(a3[k], [f[k] for f in b3])}"
                                 for k in ("E", "A", "alpha", "B", "beta"))
                     + f"   {_resamples(b3, asked)}")
        a_opt = a3["beta"] / (a3["alpha"] + a3["beta"])
        lines.append("implied N_opt ∝ C^a, a = β/(α+β) = "
                     f"{_pm(a_opt, [f['beta'] / (f['alpha'] + f['beta']) for f in b3])}")
        lines += ["", *gate.lines(fits["gate"], fits.get("seed_noise"),
                                  fits.get("holdout_judged", False),
                                  fits.get("seed_noise_source"))]
    else:
        lines.append("Approach 3: needs at least 6 runs with 3 sizes and 3 token counts")
    return lines


def optimum(fits, C: float) -> dict:
    """Compute-optimal N, D and the loss at budget C, with 95% intervals from the bootstrap
    refits: from Approach 3 where it fits (gate.judge), else from Approach 2 (N_opt = k·C^a,
    the loss from L_opt(C) = E + A·C^(−α) through each budget's minimum loss,
    chinchilla.min_loss_law). `source` says which;
    N_a2, D_a2 are Approach 2's in either case."""
    a2, a3, cost = fits["a2"], fits["a3"], fits["cost"]
    trusted = a3 is not None and fits.get("gate", {"fits": True})["fits"]
    if not trusted and a2 is None:
        raise ConfigError("--predict: neither approach can predict (Approach 3 "
                          + ("does not fit" if a3 else "could not be fitted") + "; Approach 2 "
                          "needs two budgets with a valley inside their sizes)")
    if trusted:
        n, d, loss = chinchilla.approach3_optimum(a3, C, cost)
        boot = [chinchilla.approach3_optimum(f, C, cost) for f in fits["boot3"]]
    else:
        n, d, loss = _approach2_point(a2, C, cost)
        boot = [_approach2_point(f, C, cost) for f in fits["boot2"]]
    out = dict(C=C, N=n, D=d, loss=loss, source="Approach 3" if trusted else "Approach 2",
               N_int=chinchilla.interval([b[0] for b in boot]),
               D_int=chinchilla.interval([b[1] for b in boot]),
               loss_int=chinchilla.interval([b[2] for b in boot]),
               ratio_int=chinchilla.interval([b[1] / b[0] for b in boot]))
    if a2:
        out["N_a2"], out["D_a2"] = chinchilla.approach2_optimum(a2, C)
    return out


def _approach2_point(a2: dict, C: float, cost) -> tuple[float, float, float]:
    """(N_opt, D = C / F(N_opt), L_opt(C)) from Approach 2's power law and its budgets'
    minimum losses (chinchilla.min_loss_law; nan loss with fewer than 2 fitted budgets)."""
    n = chinchilla.approach2_optimum(a2, C)[0]
    return n, C / float(cost(n)), chinchilla.min_loss_at(chinchilla.min_loss_law(a2), C)


def nearest_size(cost, n_target: float) -> str:
    """The ladder size nearest n_target, as LadderCost.nearest picks it (the one --verify
    trains), counted on the sweep's base config."""
    if not isinstance(cost, LadderCost):
        return "(sweep.json lacks the sweep's sizes or base config: ladder unknown)"
    size, n, _ = cost.nearest(n_target)
    return size_text(size, n, cost)


def size_text(size: dict, n: float, cost=None) -> str:
    ne = f", {human(cost.non_embedding(size))} non-embedding" if cost is not None else ""
    return (f"n_layers={size['n_layers']}, d_model={size['d_model']}, "
            f"n_heads={size['n_heads']}, d_ff={size['d_ff']} ({human(n)} compute-equivalent "
            f"params{ne})")


def prediction_lines(fits, C: float) -> list[str]:
    p = optimum(fits, C)
    lines = [f"compute-optimal at C = {C:.3g} FLOPs ({p['source']}, 95% bootstrap intervals):",
             f"  N_opt = {human(p['N'])} compute-equivalent params C/(6D) "
             f"[{human(p['N_int'][0])}, {human(p['N_int'][1])}]",
             f"  D_opt = {human(p['D'])} tokens [{human(p['D_int'][0])}, {human(p['D_int'][1])}]",
             f"  tokens per compute-equivalent parameter = {p['D'] / p['N']:.3g} "
             f"[{p['ratio_int'][0]:.3g}, {p['ratio_int'][1]:.3g}]",
             f"  predicted val loss = {p['loss']:.4f} "
             f"[{p['loss_int'][0]:.4f}, {p['loss_int'][1]:.4f}] nats/token"
             + ("" if p["source"] == "Approach 3" else
                " (E + A·C^(−α) through each budget's minimum loss)"),
             f"  nearest ladder size: {nearest_size(fits['cost'], p['N'])}"]
    if isinstance(fits["cost"], LadderCost):
        lines.append("  (D(N, C) = C / F(N), F counted along the ladder rule: "
                     "flops.train_flops_per_token)")
    else:
        lines.append("  (no sweep.json: F(N) = C/D is a power law fitted to the runs, "
                     "approximate away from their sizes)")
    if "N_a2" in p and p["source"] == "Approach 3":
        lines.append(f"  Approach 2 says N_opt = {human(p['N_a2'])}, D_opt = {human(p['D_a2'])}")
    return lines


def holdout_lines(runs, which: str, n_boot: int = 100) -> list[str]:
    """Refit without the largest budget; each held-out run's loss against its prediction."""
    return holdout(runs, which, n_boot)[0]


def holdout(runs, which: str, n_boot: int = 100) -> tuple[list[str], float | None]:
    """(holdout_lines, the fraction of held-out runs inside their 95% intervals, or None)."""
    if which != "largest":
        raise ConfigError(f"--holdout={which}: only 'largest' (the largest budget) is supported")
    budgets = sorted({r.get("budget", r["C"]) for r in runs})
    if len(budgets) < 2:
        raise ConfigError("--holdout=largest: needs finished runs at 2 or more budgets")
    kept = [r for r in runs if r.get("budget", r["C"]) < budgets[-1]]
    held = [r for r in runs if r.get("budget", r["C"]) == budgets[-1]]
    fits = fit_all(kept, n_boot)
    if fits["a3"] is None:
        return [f"holdout: the {len(kept)} runs below C = {budgets[-1]:.2g} cannot fit "
                "Approach 3 (needs >= 6 runs, 3 sizes, 3 token counts)"], None
    lines = [f"### Holdout: fitted without C = {budgets[-1]:.2g} ({len(kept)} runs), "
             f"predicting its {len(held)} runs", "",
             "error = predicted - actual (positive: the fit predicted a higher loss); "
             "error / half-width: in units of half the 95% interval (|x| <= 1: inside it)", "",
             "| run | val loss | predicted [95% interval] | error % | error / half-width |",
             "|---|---|---|---|---|"]
    inside = 0
    for r in held:
        pred = float(chinchilla.loss_nd(fits["a3"], r["N"], r["D"]))
        lo, hi = chinchilla.interval([float(chinchilla.loss_nd(f, r["N"], r["D"]))
                                      for f in fits["boot3"]])
        half = max((hi - lo) / 2, 1e-12)
        inside += lo <= r["loss"] <= hi
        lines.append(f"| {r['name']} | {r['loss']:.4f} | {pred:.4f} [{lo:.4f}, {hi:.4f}] "
                     f"| {100 * (pred - r['loss']) / r['loss']:+.2f} "
                     f"| {(pred - r['loss']) / half:+.2f} |")
    lines += ["", f"{inside} of {len(held)} held-out runs inside their 95% intervals"]
    return lines, inside / len(held) if held else None


def plot_isoflop(runs, fits, out):
    """isoflop.png: loss against N per budget, each parabola, its minimum, the optimum line."""
    return plot.plot_isoflop(runs, fits["a2"], fits["a3"], fits["cost"], out)

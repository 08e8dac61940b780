"""The compute-optimal part of a sweep report: IsoFLOP fits, predictions, and a holdout check.

    python -m transformer scaling --workdir=runs/isoflop --report                 # + isoflop.md
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=1e15
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest

Works on the report's rows (one per finished member of an IsoFLOP sweep). N is the
non-embedding parameter count, D the training tokens, C the budget the member was sized to;
the loss is the final validation loss in nats per token. The math is in chinchilla.py.
"""

from __future__ import annotations

import math

from transformer.config import ConfigError, ModelConfig
from transformer.model import flops
from transformer.model.sizes import human
from transformer.scaling import chinchilla, plot


def runs_of(rows) -> list[dict]:
    return [dict(C=r["budget_value"], flops=r["flops"], N=r["params_non_embedding"],
                 D=r["tokens"], loss=r["val_loss"], name=r["name"])
            for r in rows if math.isfinite(r["val_loss"])]


def fit_all(runs, n_boot: int = 100) -> dict:
    """Both approaches on all runs, their bootstrap refits, and the FLOPs-per-token law."""
    a2, a3 = chinchilla.approach2(runs), chinchilla.approach3(runs)
    fits2, fits3 = chinchilla.bootstrap(runs, n_boot, approach3_fit=a3) if a3 or a2 else ([], [])
    return dict(a2=a2, a3=a3, boot2=fits2, boot3=fits3, n_boot=n_boot,
                cost=chinchilla.flops_per_token_law(runs))


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
    lines = ["### Compute-optimal fits (95% bootstrap intervals over runs)", ""]
    if a2:
        lines += ["Approach 2 (a parabola of loss in log N per budget):", "",
                  "| budget C | N_opt | D_opt | D_opt/N_opt | loss at the minimum | minimum inside the sizes |",
                  "|---|---|---|---|---|---|"]
        for C, b in a2["budgets"].items():
            lines.append(f"| {C:.2g} | {human(b['N_opt'])} | {human(b['D_opt'])} "
                         f"| {b['D_opt'] / b['N_opt']:.3g} | {b['loss_opt']:.4f} "
                         f"| {'yes' if b['inside'] else 'NO (extrapolated)'} |")
        for C in a2.get("no_valley", []):
            lines.append(f"| {C:.2g} | - | - | - | - | no valley: loss does not turn up "
                         "within the sizes tried; left out of the fit |")
        lines += ["", f"N_opt ∝ C^a, a = {_pm(a2['a'], [f['a'] for f in b2])}; "
                  f"D_opt ∝ C^b, b = {_pm(a2['b'], [f['b'] for f in b2])}; "
                  f"a + b = {_pm(a2['a'] + a2['b'], [f['a'] + f['b'] for f in b2])} "
                  f"(1 if C ∝ N·D)   {_resamples(b2, asked)}", ""]
    else:
        lines += ["Approach 2: needs at least two budgets whose loss has a valley in log N", ""]
    if a3:
        lines.append("Approach 3: L(N, D) = E + A/N^α + B/D^β; "
                     + ", ".join(f"{k} = {_pm(a3[k], [f[k] for f in b3])}"
                                 for k in ("E", "A", "alpha", "B", "beta"))
                     + f"   {_resamples(b3, asked)}")
        a_opt = a3["beta"] / (a3["alpha"] + a3["beta"])
        lines.append("implied N_opt ∝ C^a, a = β/(α+β) = "
                     f"{_pm(a_opt, [f['beta'] / (f['alpha'] + f['beta']) for f in b3])}")
    else:
        lines.append("Approach 3: needs at least 6 runs with 2 sizes and 2 token counts")
    return lines


def optimum(fits, C: float) -> dict:
    """Compute-optimal N, D and the loss at budget C from Approach 3 (intervals from its
    bootstrap refits), and Approach 2's N, D for comparison."""
    a3, cost = fits["a3"], fits["cost"]
    if a3 is None:
        raise ConfigError("--predict: Approach 3 could not be fitted (needs >= 6 finished runs "
                          "with 2 sizes and 2 token counts)")
    n, d, loss = chinchilla.approach3_optimum(a3, C, cost)
    boot = [chinchilla.approach3_optimum(f, C, cost) for f in fits["boot3"]]
    out = dict(C=C, N=n, D=d, loss=loss, N_int=chinchilla.interval([b[0] for b in boot]),
               D_int=chinchilla.interval([b[1] for b in boot]),
               loss_int=chinchilla.interval([b[2] for b in boot]),
               ratio_int=chinchilla.interval([b[1] / b[0] for b in boot]))
    if fits["a2"]:
        out["N_a2"], out["D_a2"] = chinchilla.approach2_optimum(fits["a2"], C)
    return out


def nearest_size(sweep: dict | None, n_target: float) -> str:
    """The size of the sweep's ladder rule (d_model = aspect·L, fixed head dim; or, when every
    size has the same depth, any width at that depth) whose
    non-embedding count is nearest n_target in log space."""
    if not sweep or not sweep.get("sizes"):
        return "(no sweep.json: ladder unknown)"
    sizes = sweep["sizes"]
    size0 = sizes[0]
    mlp_ratio = size0["d_ff"] // size0["d_model"]
    if len(sizes) > 1 and len({s["n_layers"] for s in sizes}) == 1:
        # a fixed-depth ladder: width alone sets N; heads of at most the ladder's head dim
        L = size0["n_layers"]
        head_dim = max(s["d_model"] // s["n_heads"] for s in sizes)
        shapes = [(L, d, -(-d // head_dim)) for d in range(4, 8193, 4)]
        shapes = [(L, d, h) for L, d, h in shapes if not d % h]
    else:
        aspect = size0["d_model"] // size0["n_layers"]
        head_dim = size0["d_model"] // size0["n_heads"]
        shapes = [(L, aspect * L, aspect * L // head_dim) for L in range(1, 129)
                  if not aspect * L % head_dim]
    best = None
    for L, d, heads in shapes:
        m = ModelConfig(vocab_size=1, d_model=d, n_layers=L, n_heads=heads,
                        d_ff=mlp_ratio * d, max_seq_len=1)
        n = flops.param_counts(m)["non_embedding"]
        gap = abs(math.log(n / n_target))
        if best is None or gap < best[0]:
            best = (gap, f"n_layers={L}, d_model={d}, n_heads={heads}, "
                         f"d_ff={mlp_ratio * d} ({human(n)} non-embedding params)")
    return best[1]


def prediction_lines(fits, C: float, sweep) -> list[str]:
    p = optimum(fits, C)
    lines = [f"compute-optimal at C = {C:.3g} FLOPs (Approach 3, 95% bootstrap intervals):",
             f"  N_opt = {human(p['N'])} non-embedding params "
             f"[{human(p['N_int'][0])}, {human(p['N_int'][1])}]",
             f"  D_opt = {human(p['D'])} tokens [{human(p['D_int'][0])}, {human(p['D_int'][1])}]",
             f"  tokens per parameter = {p['D'] / p['N']:.3g} "
             f"[{p['ratio_int'][0]:.3g}, {p['ratio_int'][1]:.3g}]",
             f"  predicted val loss = {p['loss']:.4f} "
             f"[{p['loss_int'][0]:.4f}, {p['loss_int'][1]:.4f}] nats/token",
             f"  nearest ladder size: {nearest_size(sweep, p['N'])}"]
    if "N_a2" in p:
        lines.append(f"  Approach 2 says N_opt = {human(p['N_a2'])}, D_opt = {human(p['D_a2'])}")
    return lines


def holdout_lines(runs, which: str, n_boot: int = 100) -> list[str]:
    """Refit without the largest budget; each held-out run's loss against its prediction."""
    if which != "largest":
        raise ConfigError(f"--holdout={which}: only 'largest' (the largest budget) is supported")
    budgets = sorted({r["C"] for r in runs})
    if len(budgets) < 2:
        raise ConfigError("--holdout=largest: needs finished runs at 2 or more budgets")
    kept = [r for r in runs if r["C"] < budgets[-1]]
    held = [r for r in runs if r["C"] == budgets[-1]]
    fits = fit_all(kept, n_boot)
    if fits["a3"] is None:
        return [f"holdout: the {len(kept)} runs below C = {budgets[-1]:.2g} cannot fit "
                "Approach 3 (needs >= 6 runs, 2 sizes, 2 token counts)"]
    lines = [f"### Holdout: fitted without C = {budgets[-1]:.2g} ({len(kept)} runs), "
             f"predicting its {len(held)} runs", "",
             "error = predicted - actual (positive: the fit predicted a higher loss); "
             "error / half-width: in units of half the 95% interval (|x| <= 1: inside it)", "",
             "| run | val loss | predicted [95% interval] | error % | error / half-width |",
             "|---|---|---|---|---|"]
    for r in held:
        pred = float(chinchilla.loss_nd(fits["a3"], r["N"], r["D"]))
        lo, hi = chinchilla.interval([float(chinchilla.loss_nd(f, r["N"], r["D"]))
                                      for f in fits["boot3"]])
        half = max((hi - lo) / 2, 1e-12)
        lines.append(f"| {r['name']} | {r['loss']:.4f} | {pred:.4f} [{lo:.4f}, {hi:.4f}] "
                     f"| {100 * (pred - r['loss']) / r['loss']:+.2f} "
                     f"| {(pred - r['loss']) / half:+.2f} |")
    return lines


def plot_isoflop(runs, fits, out):
    """isoflop.png: loss against N per budget, each parabola, its minimum, the optimum line."""
    return plot.plot_isoflop(runs, fits["a2"], fits["a3"], fits["cost"], out)

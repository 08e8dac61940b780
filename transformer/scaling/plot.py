"""Figures: loss curves of any runs, and the scaling plots of a sweep report.

    python -m transformer plot runs/tiny runs/default                  # -> loss_curves.png
    python -m transformer plot runs/ladder/* --out=ladder_curves.png

Curves come from each workdir's `metrics.jsonl` (train lines: step, tokens, train_loss; eval
lines: step, tokens, val_loss): train loss solid, val loss dashed with dots, one colour per
run, against step (left) and tokens seen (right, log axis). Everything draws with
matplotlib's Agg backend, so no display is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from transformer.train.metrics import MetricsLog


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def read_curves(workdir) -> dict:
    """{'train': (steps, tokens, losses), 'val': (...)} of one run; tokens may be None."""
    rows = MetricsLog(workdir).read()
    tokens_per_step = _tokens_per_step(rows, workdir)
    out = {}
    for split, key in (("train", "train_loss"), ("val", "val_loss")):
        # A resumed run may log a step twice; keep the last value of each step.
        by_step = {r["step"]: r[key] for r in rows if key in r}
        steps = np.array(sorted(by_step), dtype=float)
        losses = np.array([by_step[s] for s in sorted(by_step)], dtype=float)
        tokens = steps * tokens_per_step if tokens_per_step else None
        out[split] = (steps, tokens, losses)
    return out


def _tokens_per_step(rows, workdir):
    for r in rows:
        if r.get("tokens") and r.get("step"):
            return r["tokens"] / r["step"]
    try:  # runs logged before metrics carried tokens: ask the checkpoint's config
        from transformer.checkpoint import Checkpoints
        config = Checkpoints(workdir, read_only=True).read_meta()["config"]
        return config["train"]["batch_size"] * config["model"]["max_seq_len"]
    except Exception:  # noqa: BLE001 - no checkpoint: plot against steps only
        return None


def labels_for(workdirs) -> list[str]:
    """The folder names, or the whole paths where two runs share a name."""
    names = [Path(w).name for w in workdirs]
    if len(set(names)) < len(names):
        return [str(w) for w in workdirs]
    return names


def plot_runs(workdirs, out, labels=None, title: str = "loss curves") -> Path:
    """Train and val loss of each run against step and tokens into one PNG."""
    plt = _pyplot()
    labels = labels or labels_for(workdirs)
    fig, (ax_step, ax_tok) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(workdirs), 1)))
    for workdir, label, color in zip(workdirs, labels, colors):
        curves = read_curves(workdir)
        for split, style in (("train", dict(lw=1.2)), ("val", dict(ls="--", marker="o", ms=3))):
            steps, tokens, losses = curves[split]
            if len(steps) == 0:
                continue
            name = f"{label} ({split})"
            ax_step.plot(steps, losses, color=color, label=name, **style)
            if tokens is not None:
                ax_tok.plot(tokens, losses, color=color, label=name, **style)
    ax_step.set(xlabel="step", ylabel="loss", title=title)
    ax_tok.set(xlabel="tokens", ylabel="loss", xscale="log", title=f"{title} against tokens")
    for ax in (ax_step, ax_tok):
        ax.grid(alpha=0.3)
    ax_step.legend(fontsize=7)
    return _save(fig, out)


def plot_scaling(x, loss, fitted, out, xlabel: str, groups=None, fit_label: str = "") -> Path:
    """Final loss against params or compute, log-log, with the fitted power law if any."""
    plt = _pyplot()
    x, loss = np.asarray(x, float), np.asarray(loss, float)
    groups = groups if groups is not None else [""] * len(x)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    color = {}
    for group in dict.fromkeys(groups):
        pick = np.array([g == group for g in groups])
        (points,) = ax.plot(x[pick], loss[pick], "o", label=group or "runs")
        color[group] = points.get_color()
    from transformer.scaling import fit
    grid = np.geomspace(x.min() / 1.5, x.max() * 1.5, 200)
    if fitted is not None and "E" not in fitted:  # {group: fit}: one curve per group
        for group, f in fitted.items():  # by name: the fits need not come in the points' order
            if f is not None:
                ax.plot(grid, fit.predict(f, grid), "--", lw=1, color=color.get(group),
                        label=f"{group}: α={f['alpha']:.3f}±{f['alpha_err']:.2g}")
    elif fitted is not None:
        ax.plot(grid, fit.predict(fitted, grid), "k--", lw=1,
                label=fit_label or f"fit: α={fitted['alpha']:.3f}±{fitted['alpha_err']:.2g}")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="final val loss")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))  # 4.70 rather than 4.7×10^0
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor x labels collide within a decade
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, out)


def plot_isoflop(runs, a2, a3, cost, out) -> Path:
    """Left: val loss against N at each budget, with its parabola and minimum (Approach 2).
    Right: the optimal N against C: the minima, Approach 2's power law, Approach 3's optimum."""
    from transformer.scaling import chinchilla
    plt = _pyplot()
    fig, (ax, ax_opt) = plt.subplots(1, 2, figsize=(12, 4.5))
    budgets = sorted({r.get("budget", r["C"]) for r in runs})  # nominal: groups the runs
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(budgets), 1)))
    by_budget = {b.get("budget", C): (C, b) for C, b in (a2 or {}).get("budgets", {}).items()}
    for budget, color in zip(budgets, colors):
        at = sorted((r for r in runs if r.get("budget", r["C"]) == budget), key=lambda r: r["N"])
        N = np.array([r["N"] for r in at], float)
        ax.plot(N, [r["loss"] for r in at], "o", color=color, label=f"C = {budget:.2g}")
        C, fitted = by_budget.get(budget, (budget, None))
        if fitted:
            grid = np.geomspace(N.min() / 1.3, N.max() * 1.3, 100)
            ax.plot(grid, np.polyval(fitted["parabola"], np.log(grid)), "-", color=color, lw=1)
            ax.plot(fitted["N_opt"], fitted["loss_opt"], "*", color=color, ms=13, mec="k")
            ax_opt.plot(C, fitted["N_opt"], "*", color=color, ms=13, mec="k")
    lo, hi = min(budgets) / 3, max(budgets) * 30
    grid_C = np.geomspace(lo, hi, 50)
    if a2:
        ax_opt.plot(grid_C, a2["kN"] * grid_C ** a2["a"], "k--", lw=1,
                    label=f"Approach 2: N_opt ∝ C^{a2['a']:.2f}")
    if a3:
        n3 = [chinchilla.approach3_optimum(a3, C, cost)[0] for C in grid_C]
        ax_opt.plot(grid_C, n3, "r:", lw=1.5, label=f"Approach 3: α={a3['alpha']:.2f}, "
                    f"β={a3['beta']:.2f}")
    ax.set(xscale="log", xlabel="non-embedding parameters N", ylabel="final val loss",
           title="IsoFLOP curves")
    ax_opt.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)",
               ylabel="compute-optimal N", title="optimal size against compute")
    for a in (ax, ax_opt):
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    return _save(fig, out)


def _save(fig, out) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m transformer plot",
                                     description="Loss curves of one or more workdirs.")
    parser.add_argument("workdirs", nargs="+", help="run folders holding metrics.jsonl")
    parser.add_argument("--out", default="loss_curves.png", help="PNG to write")
    args = parser.parse_args(argv)
    missing = [w for w in args.workdirs if not (Path(w) / "metrics.jsonl").is_file()]
    if missing:
        print(f"error: no metrics.jsonl in {', '.join(missing)}: give workdirs of training "
              "runs (python train.py --workdir=...)", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {plot_runs(args.workdirs, args.out)}")


if __name__ == "__main__":
    main()

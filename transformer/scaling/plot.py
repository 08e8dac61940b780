"""Figures: loss curves of any runs, and the scaling plots of a sweep report.

    python -m transformer plot runs/tiny                  # -> runs/tiny/loss_curves_step<N>.png
    python -m transformer plot runs/tiny runs/default --metric=val_bpb   # -> runs/val_bpb_curves_...
    python -m transformer plot runs/ladder/* --out=ladder_curves.png

Curves come from each workdir's `metrics.jsonl` (train lines: step, tokens, train_loss; eval
lines: step, tokens, val_loss, val_bpb): train loss solid, val loss dashed with dots, against
step (left) and tokens seen (right, log axis). Loss is in nats per token, which compares runs
of one tokenizer; `--metric=val_bpb` draws validation bits per byte, which compares byte,
char and BPE runs. A few runs get a colour each and a legend; many (a sweep) are coloured by
a value, such as their size, with a colour bar. Everything draws with matplotlib's Agg
backend, so no display is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from transformer.train.metrics import MetricsLog


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


METRICS = {  # what plot_runs can draw: (metrics.jsonl keys, y-axis label)
    "loss": (("train_loss", "val_loss"), "loss (nats per token)"),
    "val_bpb": ((None, "val_bpb"), "validation bits per byte"),
}


def read_curves(workdir, metric: str = "loss") -> dict:
    """{'train': (steps, tokens, values), 'val': (...)} of one run; tokens may be None.
    metric "val_bpb" has no train curve (train lines carry nats per token only): its train
    arrays are empty."""
    rows = MetricsLog(workdir).read()
    # Each line's own count (a run resumed with another batch size is not steps x one batch).
    tokens_at = {r["step"]: r["tokens"] for r in rows if "step" in r and r.get("tokens")}
    tokens_per_step = None
    out = {}
    for split, key in zip(("train", "val"), METRICS[metric][0]):
        # A resumed run may log a step twice; keep the last value of each step.
        by_step = {r["step"]: r[key] for r in rows if key and key in r}
        steps = np.array(sorted(by_step), dtype=float)
        losses = np.array([by_step[s] for s in sorted(by_step)], dtype=float)
        if all(s in tokens_at for s in by_step):
            tokens = np.array([tokens_at[s] for s in sorted(by_step)], dtype=float)
        else:  # runs logged before metrics carried tokens
            tokens_per_step = tokens_per_step or _tokens_per_step(rows, workdir)
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


def plot_runs(workdirs, out, labels=None, title: str = "loss curves", metric: str = "loss",
              color_by=None, color_label: str = "") -> Path:
    """Train (solid) and val (dashed, dots) curves of each run against step and tokens, into
    one PNG. Up to 10 runs get a colour each and a legend beside the plots; more, or any run
    given a `color_by` value (e.g. its parameter count), are coloured by that value (log
    scale; the run's order when none) with a colour bar, so that 5 runs and 50 read alike."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.lines import Line2D
    labels = labels or labels_for(workdirs)
    fig, (ax_step, ax_tok) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    by_value = color_by is not None or len(workdirs) > 10
    values = np.asarray(color_by if color_by is not None else range(1, len(workdirs) + 1), float)
    norm = (LogNorm(values.min(), values.max()) if color_by is not None and values.min() > 0
            and values.max() > values.min() else Normalize(values.min(), max(values.max(),
                                                                               values.min() + 1)))
    cmap = plt.cm.viridis
    colors = ([cmap(0.9 * norm(v)) for v in values] if by_value else
              plt.cm.tab10(np.arange(len(workdirs)) % 10))
    keys, ylabel = METRICS[metric]
    for workdir, label, color in zip(workdirs, labels, colors):
        curves = read_curves(workdir, metric)
        name = label  # one legend entry per run, on its first curve
        for split, style in (("train", dict(lw=1.2)), ("val", dict(ls="--", marker="o", ms=3))):
            steps, tokens, losses = curves[split]
            if len(steps) == 0:
                continue
            ax_step.plot(steps, losses, color=color, label=name, **style)
            name = None
            if tokens is not None:
                ax_tok.plot(tokens, losses, color=color, **style)
    ax_step.set(xlabel="step", ylabel=ylabel, title=title)
    ax_tok.set(xlabel="tokens", ylabel=ylabel, xscale="log", title=f"{title} against tokens")
    for ax in (ax_step, ax_tok):
        ax.grid(alpha=0.3)
    styles = [Line2D([], [], color="k", lw=1.2, label="train"),
              Line2D([], [], color="k", ls="--", marker="o", ms=3, label="val")]
    ax_tok.legend(handles=styles[1:] if keys[0] is None else styles, fontsize=8,
                  loc="upper right")
    if by_value:
        bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=_scaled(cmap, 0.9)),
                           ax=[ax_step, ax_tok], pad=0.01)
        bar.set_label(color_label if color_by is not None else "run (in the order given)")
    else:
        ax_step.get_figure().legend(*ax_step.get_legend_handles_labels(), loc="outside right upper",
                                    fontsize=8, title="runs")
    return _save(fig, out)


def _scaled(cmap, top: float):
    """The colour map's first `top` of its range (viridis's pale yellow end is hard to see)."""
    from matplotlib.colors import ListedColormap
    return ListedColormap(cmap(np.linspace(0, top, 256)))


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
        C, fitted = by_budget.get(budget, (budget, None))
        note = ("" if fitted or not a2 else " (fewer than 3 sizes: not fitted)"
                if len(set(N)) < 3 else " (no valley: not fitted)")
        ax.plot(N, [r["loss"] for r in at], "o", color=color, label=f"C = {budget:.2g}{note}")
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
    ax.set(xscale="log", xlabel="compute-equivalent parameters N = C/(6D)",
           ylabel="final val loss", title="IsoFLOP curves")
    ax_opt.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)",
               ylabel="compute-optimal N", title="optimal size against compute")
    for a in (ax, ax_opt):
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    return _save(fig, out)


def _save(fig, out) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def default_out(workdirs, metric: str = "loss") -> Path:
    """Where a plot goes without --out: into the run's own folder, named by its last logged
    step (a later plot of the same run does not overwrite an earlier one); for several runs,
    their common folder, named after them."""
    name = "loss_curves" if metric == "loss" else f"{metric}_curves"
    if len(workdirs) == 1:
        steps = [r["step"] for r in MetricsLog(workdirs[0]).read() if "step" in r]
        return Path(workdirs[0]) / f"{name}_step{max(steps, default=0)}.png"
    paths = [Path(w).resolve() for w in workdirs]
    common = Path(os.path.commonpath(paths))
    runs = "+".join(p.name for p in paths)
    return common / (f"{name}_{runs}.png" if len(runs) <= 80 else f"{name}_{len(paths)}_runs.png")


def main(argv=None):
    from transformer import cli
    parser = cli.argument_parser(prog="python -m transformer plot",
                                 description="Loss curves of one or more workdirs.")
    parser.add_argument("workdirs", nargs="+", help="run folders holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG to write (default: in the run's "
                        "folder, loss_curves_step<N>.png; for several runs, in their common "
                        "folder)")
    parser.add_argument("--metric", default="loss", choices=list(METRICS),
                        help="loss: train and val loss in nats per token (runs of one "
                        "tokenizer); val_bpb: validation bits per byte (compares byte, char and "
                        "BPE runs)")
    args = parser.parse_args(argv)
    missing = [w for w in args.workdirs if not (Path(w) / "metrics.jsonl").is_file()]
    if missing:
        print(f"error: no metrics.jsonl in {', '.join(missing)}: give workdirs of training "
              "runs (python train.py --workdir=...)", file=sys.stderr)
        sys.exit(2)
    out = args.out or default_out(args.workdirs, args.metric)
    why = cli.cannot_write(out, folder=False)
    if why:
        cli.fail(f"--out={out}: cannot write there ({why}); choose another --out")
    print(f"wrote {plot_runs(args.workdirs, out, metric=args.metric)}")


if __name__ == "__main__":
    main()

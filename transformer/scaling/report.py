"""What a sweep's finished runs say: tables, fits and plots.

    python -m transformer scaling --workdir=runs/ladder --report
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=1e15

The report writes report.csv, report.md, fit.json and three PNGs into the workdir:
loss_vs_params.png, loss_vs_compute.png and loss_curves.png; an IsoFLOP sweep (budget kind
`flops`) adds Chinchilla's approaches 2 and 3 with bootstrap intervals, the compute-optimal
size at its largest budget and isoflop.png (transformer/scaling/isoflop.py). A sweep with
variants fits one curve per group.
"""


from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np

from transformer.config import ConfigError
from transformer.model.sizes import human
from transformer.scaling import fit, plot
from transformer.scaling.sweep import _read_json, _sweep_of, budget_label, write_atomic
from transformer.train.metrics import MetricsLog

COLUMNS = ("name", "group", "n_layers", "d_model", "params_total", "params_non_embedding",
           "tokens", "flops", "train_loss", "val_loss", "val_bpb", "wall_s", "tokens_per_s")


def collect(workdir) -> list[dict]:
    """One row per finished member, with its final losses and median throughput."""
    rows = []
    for result_path in sorted(Path(workdir).glob("*/result.json")):
        row = json.loads(result_path.read_text())
        lines = MetricsLog(result_path.parent).read()
        train = [r for r in lines if "train_loss" in r]
        val = [r for r in lines if "val_loss" in r]
        row["train_loss"] = train[-1]["train_loss"] if train else math.nan
        row["val_loss"] = val[-1]["val_loss"] if val else math.nan
        row["val_bpb"] = val[-1].get("val_bpb", math.nan) if val else math.nan
        row.setdefault("group", "")
        if row.get("wall_s") is None:  # a member resumed from a checkpoint older than the count
            row["wall_s"] = math.nan
        # The first interval includes compilation; the median ignores it.
        rates = [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
        row["tokens_per_s"] = float(np.median(rates)) if rates else math.nan
        row["workdir"] = str(result_path.parent)
        rows.append(row)
    # Variant by variant in sweep order, then by budget and size: one variant's ladder reads
    # as one block of the table, and the first variant is the baseline of the gap table.
    order = {g: i for i, g in enumerate(dict.fromkeys(r["group"] for r in sorted(
        rows, key=lambda r: r.get("index", 0))))}
    return sorted(rows, key=lambda r: (order[r["group"]], r["budget_value"],
                                       r["params_non_embedding"]))


def _frontier(rows):
    """Runs no cheaper run beats: the compute-efficient frontier that L(C) is fitted to."""
    best, out = math.inf, []
    for r in sorted(rows, key=lambda r: r["flops"]):
        if r["val_loss"] < best:
            best = r["val_loss"]
            out.append(r)
    return out


_SEED = re.compile(r"(^|_)seed=-?\d+(?=_|$)")


def _seedless(name: str) -> str:
    """A member's name without its seed variant ("seed=1_L4-d8_flop6.0e10" -> "L4-d8_...")."""
    return _SEED.sub("", name).lstrip("_")


def seed_means(rows) -> list[dict]:
    """One row per member up to its seed: the seeds of one member (variants that set
    train.seed, named seed=<s>, the first seed's with the plain name) averaged. The row keeps
    the first seed's fields, its val_loss is the mean over the seeds, `val_losses` the
    losses by seed and `seeds` how many. A member of one seed passes through unchanged."""
    by = {}
    for r in sorted(rows, key=lambda r: (r.get("seed") or 0, r["name"])):
        by.setdefault((r["group"], _seedless(r["name"])), []).append(r)
    out = []
    for same in by.values():
        row = dict(same[0])
        losses = [r["val_loss"] for r in same]
        row.update(val_loss=float(np.mean(losses)), val_losses=losses, seeds=len(same))
        out.append(row)
    return out


def seed_noise(rows) -> tuple[float, int] | None:
    """(the seed noise: the standard deviation of one run's final val loss over seeds, pooled
    over every member trained at 2 or more seeds, nats; how many such members), or None when
    no member has 2 seeds. Pooled as the root mean of each member's variance (ddof 1): the
    seeds of one member share its size, budget and settings and differ only in seed."""
    variances = [np.var(r["val_losses"], ddof=1) for r in seed_means(rows)
                 if r["seeds"] > 1 and np.isfinite(r["val_losses"]).all()]
    if not variances:
        return None
    return float(np.sqrt(np.mean(variances))), len(variances)


def best_per_size(rows) -> list[dict]:
    """One row per (group, budget, size): a member's seeds averaged (seed_means), then the
    lowest val loss, so that members differing only in a tuned field (train.lr) count once,
    at their best value, in every fit."""
    best = {}
    for r in seed_means(rows):
        key = (r["group"], r["budget_value"], r["params_non_embedding"])
        if key not in best or r["val_loss"] < best[key]["val_loss"]:
            best[key] = r
    return sorted(best.values(), key=lambda r: (r["budget_value"], r["params_non_embedding"]))


def _fits(ok) -> dict:
    """L(N) across sizes at the largest budget (fixed tokens or tokens per parameter: an
    IsoFLOP budget trades size against tokens, so its L(N) is a valley, not a power law),
    L(C) on the compute frontier, L(N, D) on every run."""
    budgets = sorted({r["budget_value"] for r in ok})
    largest = [r for r in ok if r["budget_value"] == budgets[-1]] if budgets else []
    if ok and ok[0]["budget"] == "flops":
        largest = []
    frontier = _frontier(ok)
    fits = {
        "L(N)": fit.power_law([r["params_non_embedding"] for r in largest],
                              [r["val_loss"] for r in largest]),
        "L(C)": fit.power_law([r["flops"] for r in frontier], [r["val_loss"] for r in frontier]),
        "L(N,D)": fit.power_law_nd([r["params_non_embedding"] for r in ok],
                                   [r["tokens"] for r in ok], [r["val_loss"] for r in ok]),
    }
    lines = []
    isoflop = bool(ok) and ok[0]["budget"] == "flops"
    for name, f in fits.items():
        x = {"L(N)": "N", "L(C)": "C", "L(N,D)": "N"}[name]
        if name == "L(N)" and isoflop:
            lines.append("L(N): not fitted for an IsoFLOP sweep (at a fixed budget a larger "
                         "model sees fewer tokens: a valley, not a power law; see the "
                         "compute-optimal fits below)")
            continue
        lines.append(f"{name}: " + (fit.describe(f, x) if f else "not enough points to fit"
                                    + (" (needs >= 6 runs with 3 sizes and 3 token counts)"
                                       if name == "L(N,D)" else "")))
    if len(budgets) > 1 and largest:
        lines.append(f"(L(N) uses the {len(largest)} runs of the largest budget)")
    if largest:
        lines.append("val loss falls monotonically with size: "
                     + ("yes" if _monotonic(largest) else "NO"))
    return fits, lines


def _isoflop_section(workdir, ok, holdout, n_boot, noise=None) -> tuple[dict, list[str]]:
    from transformer.scaling import isoflop
    runs = isoflop.runs_of(ok)
    held_lines, inside = isoflop.holdout(runs, holdout, n_boot) if holdout else ([], None)
    fits = isoflop.fit_all(runs, n_boot, _sweep_of(workdir), holdout_inside=inside,
                           measured_noise=noise)
    lines = ["", *isoflop.describe(fits), "", *isoflop.axes_lines(runs)]
    if noise:
        lines += ["", f"seed noise: {noise[0]:.4f} nats (the standard deviation of one run's "
                  f"final val loss over seeds, pooled over the {noise[1]} members trained at 2 "
                  "or more seeds); the fits use each member's mean over its seeds"]
    if fits["a3"] is not None or fits["a2"] is not None:
        largest = max(r["budget"] for r in runs)
        lines += ["", *isoflop.prediction_lines(fits, largest)]
    if holdout:
        lines += ["", *held_lines]
    png = isoflop.plot_isoflop(runs, fits, workdir / "isoflop.png")
    lines.append(f"wrote {png}")
    summary = {"seed_noise": fits["seed_noise"], "seed_noise_source": fits["seed_noise_source"],
               "approach2": {k: v for k, v in (fits["a2"] or {}).items() if k != "budgets"},
               "approach3": fits["a3"],
               "approach3_fits": {k: v for k, v in fits["gate"].items() if k != "budgets"}}
    return summary, lines


def report(workdir, log=print, holdout: str | None = None, n_boot: int = 100) -> dict:
    """Writes the table, the fits and the plots of the finished members; returns the fits
    (of the one group, or {group: fits} when the sweep has variants)."""
    workdir = Path(workdir)
    rows = collect(workdir)
    if not rows:
        raise ConfigError(f"--workdir={workdir}: no finished sweep members there (each has a "
                          "result.json); run the sweep first")
    expected = (_read_json(workdir / "sweep.json") or {}).get("members", [])
    missing = sorted(set(expected) - {r["name"] for r in rows})

    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(workdir / "report.csv", table.getvalue())
    lines = [markdown_table(rows)]
    ok = best_per_size([r for r in rows if math.isfinite(r["val_loss"])])
    if not ok:
        raise ConfigError(f"--workdir={workdir}: none of its {len(rows)} finished members has a "
                          "finite final val loss in its metrics.jsonl: nothing to fit or plot")
    fitted = {r["group"] for r in ok}
    groups = [g for g in dict.fromkeys(r["group"] for r in rows) if g in fitted]
    by_group = {}
    for g in groups:
        fits, fit_lines = _fits([r for r in ok if r["group"] == g])
        if rows[0]["budget"] == "flops" and len(groups) == 1:
            fits["isoflop"], iso_lines = _isoflop_section(
                workdir, ok, holdout, n_boot,
                seed_noise([r for r in rows if math.isfinite(r["val_loss"])]))
            fit_lines += iso_lines
        by_group[g] = fits
        lines += ["", *([f"## {g}", ""] if len(groups) > 1 else []), *fit_lines]
    if len(groups) > 1:
        lines += ["", *gap_table(ok, groups)]
    fits = by_group[groups[0]] if len(groups) == 1 else by_group
    write_atomic(workdir / "fit.json", json.dumps(fits, indent=1, default=float))
    if missing:
        lines.append(f"not finished yet: {', '.join(missing)}")
    no_loss = [r["name"] for r in rows if not math.isfinite(r["val_loss"])]
    if no_loss:  # finished, in the table, but in no fit: say so
        lines.append(f"left out of the fits (val loss not finite): {', '.join(no_loss)}")
    write_atomic(workdir / "report.md", "\n".join(lines) + "\n")
    lines.append("wrote " + ", ".join(str(p) for p in [workdir / "report.csv",
                                                         workdir / "report.md",
                                                         workdir / "fit.json",
                                                         *_plots(workdir, rows, ok, by_group)]))
    log("\n".join(lines))
    return fits


def _plots(workdir, rows, ok, by_group):
    """Loss against N and C: one colour and one fitted curve per group when there are
    variants, else one colour per budget and the single fit."""
    if len(by_group) > 1:
        labels, points = [r["group"] for r in ok], ok
        fit_n = {g: f["L(N)"] for g, f in by_group.items()}
        fit_c = {g: f["L(C)"] for g, f in by_group.items()}
    else:
        points, (only,) = rows, by_group.values()
        labels = [budget_label(r["budget"], r["budget_value"]) for r in rows]
        fit_n, fit_c = only["L(N)"], only["L(C)"]
    return [
        plot.plot_scaling([r["params_non_embedding"] for r in points],
                          [r["val_loss"] for r in points], fit_n, workdir / "loss_vs_params.png",
                          "non-embedding parameters N", labels),
        plot.plot_scaling([r["flops"] for r in points], [r["val_loss"] for r in points], fit_c,
                          workdir / "loss_vs_compute.png", "training compute C (FLOPs)", labels),
        plot.plot_runs([r["workdir"] for r in rows], workdir / "loss_curves.png",
                       labels=[r["name"] for r in rows], title="sweep",
                       color_by=[r["params_non_embedding"] for r in rows],
                       color_label="non-embedding parameters N"),
    ]


def predict(workdir, flops_budget: float, log=print, n_boot: int = 100) -> dict:
    """Compute-optimal N, D and loss at any budget, from the IsoFLOP runs in `workdir`."""
    from transformer.scaling import isoflop
    workdir = Path(workdir)
    finite = [r for r in collect(workdir) if math.isfinite(r["val_loss"])]
    ok = best_per_size(finite)
    if not ok or ok[0]["budget"] != "flops":
        raise ConfigError(f"--predict: {workdir} holds no finished IsoFLOP runs "
                          "(sweep.budget_kind='flops'); run such a sweep first")
    groups = list(dict.fromkeys(r["group"] for r in ok))
    if len(groups) > 1:  # one fit through several variants' runs would predict none of them
        raise ConfigError(f"--predict: {workdir} holds the runs of {len(groups)} variants "
                          f"({', '.join(groups)}); the compute-optimal fits take one sweep "
                          "without variants (the report fits each variant's L(N) and L(C))")
    fits = isoflop.fit_all(isoflop.runs_of(ok), n_boot, _sweep_of(workdir),
                           measured_noise=seed_noise(finite))
    log("\n".join(isoflop.prediction_lines(fits, flops_budget)))
    return isoflop.optimum(fits, flops_budget)


def gap_table(rows, groups) -> list[str]:
    """Each group's val loss minus the first group's, size by size (same n_layers and d_model,
    same budget): the runs of one size share their seed, data order and val batches, so the
    difference is paired, and its trend with N is the change's scaling."""
    first, others = groups[0], groups[1:]
    at = {(r["group"], r["budget_value"], r["n_layers"], r["d_model"]): r for r in rows}
    lines = [f"val loss minus {first}'s at each size (negative: better than {first}):", "",
             "| size | budget | N | " + f"{first} | " + " | ".join(f"{g} − {first}" for g in others)
             + " |", "|" + "---|" * (4 + len(others))]
    for (group, budget, n_layers, d_model), base in sorted(
            at.items(), key=lambda kv: (kv[0][1], kv[1]["params_non_embedding"])):
        if group != first:
            continue
        deltas = [at.get((g, budget, n_layers, d_model)) for g in others]
        lines.append(f"| L{n_layers}-d{d_model} | {budget_label(base['budget'], budget)} "
                     f"| {human(base['params_non_embedding'])} | {base['val_loss']:.4f} | "
                     + " | ".join(f"{r['val_loss'] - base['val_loss']:+.4f}" if r else "-"
                                  for r in deltas) + " |")
    return lines


def _monotonic(rows) -> bool:
    losses = [r["val_loss"] for r in sorted(rows, key=lambda r: r["params_non_embedding"])]
    return all(b < a for a, b in zip(losses, losses[1:]))


def markdown_table(rows) -> str:
    header = ("| run | params | non-emb params | tokens | FLOPs | train loss | val loss "
              "| val bpb | wall s | tokens/s |")
    lines = [header, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['name']} | {human(r['params_total'])} | {human(r['params_non_embedding'])} "
            f"| {human(r['tokens'])} | {r['flops']:.3g} | {r['train_loss']:.4f} "
            f"| {r['val_loss']:.4f} | {r.get('val_bpb', math.nan):.4f} | {r['wall_s']:.0f} "
            f"| {r['tokens_per_s']:,.0f} |")
    return "\n".join(lines)

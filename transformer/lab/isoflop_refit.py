"""Refit a published IsoFLOP sweep from its records, without its run folders or any training.

    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop.py --seed_noise=0.01
    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop.py --seed_noise=0.01 --record
    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop_rules.py --predict=2.4e13
    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop_rules.py --predict=9.6e13 \
        --verify=runs/isoflop_rules --seeds=2   # train the prediction, from the records alone
    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop.py scaling/cpu_isoflop_rules.py \
        --plot=docs/scaling_optima.png

Each member record of docs/records/scaling.jsonl whose command names the sweep file holds the
member's name and final val loss; the sweep file rebuilds the member (sweep.members), so its
exact tokens, parameter counts and counted FLOPs come from the config, not from the rounded
figures of the record. The fits are the report's (isoflop.fit_all, gate.judge, the holdout of
the largest budget); `--record` appends the refit's figures as one record. `--verify=WORKDIR`
runs the sweep's --verify (scaling/verify.py) on these fits, into WORKDIR/verify/flop<C>/, so
a published prediction is checked from a clone that has the records and none of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import ml_collections

from transformer.config.files import load
from transformer.model import flops
from transformer.model.sizes import model_config_of
from transformer.scaling import chinchilla, isoflop, report, sweep as sweep_lib

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "records" / "scaling.jsonl"


def rows_from_records(sweep_file: str, records=RECORDS) -> tuple[list[dict], dict]:
    """(report-like rows of the sweep's recorded members, the sweep as a dict)."""
    sweep = load(sweep_file)  # relative paths from configs/
    members = {m.name: m for m in sweep_lib.members(sweep)}
    name = Path(sweep_file).name
    rows = {}  # by member: a member recorded twice (retrained on a new machine) counts once,
    # at its latest record
    for line in Path(records).read_text().splitlines():
        rec = json.loads(line)
        run = rec["result"].get("run")
        if f"--sweep=configs/scaling/{name} " not in rec["command"] + " " or run not in members:
            continue  # another sweep's member, or its fits
        m = members[run]
        model = model_config_of(ml_collections.ConfigDict(m.config.to_dict()))
        counts = flops.param_counts(model)
        rows[run] = dict(name=run, budget="flops", budget_value=m.value, tokens=m.tokens,
                         flops=flops.train_flops_per_token(model) * m.tokens,
                         params_non_embedding=counts["non_embedding"],
                         params_total=counts["total"], val_loss=rec["result"]["val_loss"],
                         group=m.group, seed=m.config.train.seed)
    return list(rows.values()), json.loads(sweep.to_json())


def refit(sweep_file: str, seed_noise: float | None, n_boot: int = 100,
          predict: float | None = None) -> tuple[list, dict]:
    """(report lines, flat figures for a record); with `predict` (FLOPs) the compute-optimal
    size and loss there too, as --predict and --verify compute them (isoflop.optimum)."""
    rows, sweep = rows_from_records(sweep_file)
    measured = report.seed_noise(rows)  # members recorded at 2 or more seeds
    runs = isoflop.runs_of(report.best_per_size(rows))  # a member's seeds averaged
    held, inside = isoflop.holdout(runs, "largest", n_boot)
    if seed_noise:
        sweep["seed_noise"] = seed_noise
    fits = isoflop.fit_all(runs, n_boot, sweep, holdout_inside=inside, measured_noise=measured)
    seeds = sorted({r["seed"] for r in rows if r.get("seed") is not None})
    lines = [f"{len(rows)} member records of {sweep_file} ({len(runs)} sizes x budgets, "
             f"seeds {seeds}: each point the mean over its seeds)", "",
             *isoflop.describe(fits), "", *isoflop.axes_lines(runs), "", *held]
    if measured:
        lines += ["", f"seed noise {measured[0]:.4f} nats, pooled over the seeds of "
                  f"{measured[1]} members"]
    a2, b2 = fits["a2"], fits["boot2"]
    figures = {"runs": len(runs), "N": "compute-equivalent C/(6D)"}
    if measured:
        figures.update(member_records=len(rows), seeds=", ".join(map(str, seeds)),
                       seed_noise_measured=round(measured[0], 4),
                       seed_noise_members=measured[1])
    for label, key in isoflop.N_AXES:
        f = chinchilla.approach2([dict(r, N=r[key]) for r in runs])
        short = key.removeprefix("N_") if key != "N" else "compute_equivalent"
        figures[f"a_{short}"] = round(f["a"], 3)
        figures[f"a_plus_b_{short}"] = round(f["a"] + f["b"], 3)
    lo, hi = chinchilla.interval([f["a"] for f in b2])
    figures.update(a=round(a2["a"], 3), a_interval=f"{lo:.3f}, {hi:.3f}", b=round(a2["b"], 3))
    lo, hi = chinchilla.interval([f["b"] for f in b2])
    figures["b_interval"] = f"{lo:.3f}, {hi:.3f}"
    within = chinchilla.bootstrap_within_budgets(runs, n_boot)
    lo_w, hi_w = chinchilla.interval([f["a"] for f in within])
    figures["a_interval_within_budgets"] = f"{lo_w:.3f}, {hi_w:.3f}"
    lines += ["", f"a's 95% interval with resamples drawn within each budget (a diagnostic: "
              f"budgets and sizes fixed): [{lo_w:.3f}, {hi_w:.3f}], {len(within)} of {n_boot}"]
    lo, hi = chinchilla.interval([f["a"] + f["b"] for f in b2])
    figures.update(a_plus_b=round(a2["a"] + a2["b"], 3), a_plus_b_interval=f"{lo:.3f}, {hi:.3f}")
    figures["tokens_per_param_opt"] = ", ".join(
        f"{b['D_opt'] / b['N_opt']:.3g} ({C:.1e})" for C, b in a2["budgets"].items())
    g = fits["gate"]
    law = chinchilla.min_loss_law(a2)
    if law:
        figures["min_loss_law"] = f"E {law[0]:.3f}, A {law[1]:.4g}, alpha {law[2]:.4f}"
    figures.update(approach3_rmse=round(g["rmse"], 4), seed_noise=seed_noise,
                   approach3_budget_means=", ".join(f"{m:+.3f} ({b:.0e})" for b, (m, _, _)
                                                    in g["budgets"].items()),
                   holdout_inside=f"{inside:.2f}" if inside is not None else "none",
                   approach3_fits="yes" if g["fits"] else "no: " + "; ".join(g["reasons"]))
    if predict:
        p = isoflop.optimum(fits, predict)
        size, n, _ = fits["cost"].nearest(p["N"])
        lines += ["", *isoflop.prediction_lines(fits, predict)]
        figures.update(predict_flops=predict, predict_source=p["source"],
                       predict_N=f"{p['N']:.4g} [{p['N_int'][0]:.4g}, {p['N_int'][1]:.4g}]",
                       predict_loss=round(p["loss"], 4),
                       predict_loss_interval=f"{p['loss_int'][0]:.4f}, {p['loss_int'][1]:.4f}",
                       predict_size=size["name"])
    return lines, figures


def plot_optima(sweep_files, out, seed_noise=None) -> Path:
    """N_opt and D_opt against C (Approach 2's minima and power laws) for each sweep's records:
    the first sweep's N counted both ways (non-embedding, as published; compute-equivalent, as
    refitted), every later sweep's compute-equivalent; Chinchilla's C^0.5 drawn for reference."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (ax_n, ax_d) = plt.subplots(1, 2, figsize=(11, 4.3))
    styles = iter(["C0", "C1", "C2", "C3", "C4"])
    anchor = None
    for i, sweep_file in enumerate(sweep_files):
        runs = isoflop.runs_of(report.best_per_size(rows_from_records(sweep_file)[0]))
        axes = [("non-embedding N (as published)", "N_non_embedding")] if i == 0 else []
        for label, key in axes + [("compute-equivalent N = C/(6D)", "N")]:
            f = chinchilla.approach2([dict(r, N=r[key]) for r in runs])
            C = np.array(f["fitted"], float)
            grid = np.geomspace(C.min() / 2, C.max() * 2, 20)
            color = next(styles)
            name = f"{Path(sweep_file).stem}, {label}"
            ax_n.plot(C, [f["budgets"][c]["N_opt"] for c in C], "o", color=color)
            ax_n.plot(grid, f["kN"] * grid ** f["a"], "-", color=color,
                      label=f"{name}: C^{f['a']:.2f}")
            if key == "N":
                ax_d.plot(C, [f["budgets"][c]["D_opt"] for c in C], "o", color=color)
                ax_d.plot(grid, f["kD"] * grid ** f["b"], "-", color=color,
                          label=f"{Path(sweep_file).stem}: C^{f['b']:.2f}")
                anchor = anchor or (grid, f["kN"] * grid ** f["a"], f["kD"] * grid ** f["b"])
    grid, n_line, d_line = anchor
    mid = len(grid) // 2
    for ax, line in ((ax_n, n_line), (ax_d, d_line)):
        ax.plot(grid, line[mid] * (grid / grid[mid]) ** 0.5, "k:", label="Chinchilla: C^0.5")
        ax.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    ax_n.set(ylabel="compute-optimal N", title="N_opt against C (Approach 2)")
    ax_d.set(ylabel="compute-optimal D (tokens)", title="D_opt against C (Approach 2)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="+", help="sweep files, relative to configs/")
    parser.add_argument("--seed_noise", type=float, default=None)
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--record", action="store_true", help="append the first sweep's refit")
    parser.add_argument("--plot", default=None, help="PNG of N_opt and D_opt against C")
    parser.add_argument("--predict", type=float, default=None, help="FLOPs: the optimum there")
    parser.add_argument("--verify", default=None, metavar="WORKDIR",
                        help="train the predicted size at --predict FLOPs (default 4x the "
                        "largest budget) and the sizes at half and twice its N, --seeds each, "
                        "in WORKDIR/verify/flop<C>/")
    parser.add_argument("--seeds", type=int, default=2, help="with --verify: seeds per size")
    args = parser.parse_args(argv)
    if args.plot:
        print(f"wrote {plot_optima(args.sweep, args.plot)}")
        return
    if args.verify:
        from transformer.scaling import verify
        rows, sweep = rows_from_records(args.sweep[0])
        if args.seed_noise:
            sweep["seed_noise"] = args.seed_noise
        verify.verify(args.verify, args.predict, n_boot=args.bootstrap, progress=False,
                      seeds=args.seeds, rows=rows, saved=sweep)
        return
    lines, figures = refit(args.sweep[0], args.seed_noise, args.bootstrap, args.predict)
    print("\n".join(lines))
    if args.record:
        from transformer.lab import records
        command = (f"python -m transformer.lab.isoflop_refit {args.sweep[0]} --seed_noise="
                   f"{args.seed_noise} --bootstrap={args.bootstrap}"
                   + (f" --predict={args.predict:g}" if args.predict else "") + " --record")
        records.append(RECORDS, records.record(
            {"cpu": f"any ({platform.machine()}): no training, a refit of recorded losses",
             "cores": os.cpu_count()}, command,
            [int(x) for x in str(figures.get("seeds", "0")).split(", ")],
            figures, note="refit of the recorded members, no training: N as the FLOP count "
            "counts it (compute-equivalent C/(6D)); the other counts as columns"))


if __name__ == "__main__":
    main()

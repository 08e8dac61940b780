"""Refit a published IsoFLOP sweep from its records, without its run folders or any training.

    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop.py --seed_noise=0.01
    python -m transformer.lab.isoflop_refit scaling/cpu_isoflop.py --seed_noise=0.01 --record

Each member record of docs/records/scaling.jsonl whose command names the sweep file holds the
member's name and final val loss; the sweep file rebuilds the member (sweep.members), so its
exact tokens, parameter counts and counted FLOPs come from the config, not from the rounded
figures of the record. The fits are the report's (isoflop.fit_all, gate.judge, the holdout of
the largest budget); `--record` appends the refit's figures as one record.
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
from transformer.scaling import chinchilla, isoflop, sweep as sweep_lib

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "records" / "scaling.jsonl"


def rows_from_records(sweep_file: str, records=RECORDS) -> tuple[list[dict], dict]:
    """(report-like rows of the sweep's recorded members, the sweep as a dict)."""
    sweep = load(sweep_file)  # relative paths from configs/
    members = {m.name: m for m in sweep_lib.members(sweep)}
    name = Path(sweep_file).name
    rows = []
    for line in Path(records).read_text().splitlines():
        rec = json.loads(line)
        run = rec["result"].get("run")
        if f"--sweep=configs/scaling/{name} " not in rec["command"] + " " or run not in members:
            continue  # another sweep's member, or its fits
        m = members[run]
        model = model_config_of(ml_collections.ConfigDict(m.config.to_dict()))
        counts = flops.param_counts(model)
        rows.append(dict(name=run, budget="flops", budget_value=m.value, tokens=m.tokens,
                         flops=flops.train_flops_per_token(model) * m.tokens,
                         params_non_embedding=counts["non_embedding"],
                         params_total=counts["total"], val_loss=rec["result"]["val_loss"]))
    return rows, json.loads(sweep.to_json())


def refit(sweep_file: str, seed_noise: float | None, n_boot: int = 100) -> tuple[list, dict]:
    """(report lines, flat figures for a record)."""
    rows, sweep = rows_from_records(sweep_file)
    runs = isoflop.runs_of(rows)
    held, inside = isoflop.holdout(runs, "largest", n_boot)
    if seed_noise:
        sweep["seed_noise"] = seed_noise
    fits = isoflop.fit_all(runs, n_boot, sweep, holdout_inside=inside)
    lines = [f"{len(runs)} member records of {sweep_file}", "", *isoflop.describe(fits), "",
             *isoflop.axes_lines(runs), "", *held]
    a2, b2 = fits["a2"], fits["boot2"]
    figures = {"runs": len(runs), "N": "compute-equivalent C/(6D)"}
    for label, key in isoflop.N_AXES:
        f = chinchilla.approach2([dict(r, N=r[key]) for r in runs])
        short = key.removeprefix("N_") if key != "N" else "compute_equivalent"
        figures[f"a_{short}"] = round(f["a"], 3)
        figures[f"a_plus_b_{short}"] = round(f["a"] + f["b"], 3)
    lo, hi = chinchilla.interval([f["a"] for f in b2])
    figures.update(a=round(a2["a"], 3), a_interval=f"{lo:.3f}, {hi:.3f}", b=round(a2["b"], 3))
    lo, hi = chinchilla.interval([f["b"] for f in b2])
    figures["b_interval"] = f"{lo:.3f}, {hi:.3f}"
    lo, hi = chinchilla.interval([f["a"] + f["b"] for f in b2])
    figures.update(a_plus_b=round(a2["a"] + a2["b"], 3), a_plus_b_interval=f"{lo:.3f}, {hi:.3f}")
    figures["tokens_per_param_opt"] = ", ".join(
        f"{b['D_opt'] / b['N_opt']:.3g} ({C:.1e})" for C, b in a2["budgets"].items())
    g = fits["gate"]
    figures.update(approach3_rmse=round(g["rmse"], 4), seed_noise=seed_noise,
                   approach3_budget_means=", ".join(f"{m:+.3f} ({b:.0e})" for b, (m, _, _)
                                                    in g["budgets"].items()),
                   holdout_inside=f"{inside:.2f}" if inside is not None else "none",
                   approach3_fits="yes" if g["fits"] else "no: " + "; ".join(g["reasons"]))
    return lines, figures


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep")
    parser.add_argument("--seed_noise", type=float, default=None)
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    lines, figures = refit(args.sweep, args.seed_noise, args.bootstrap)
    print("\n".join(lines))
    if args.record:
        from transformer.lab import records
        command = (f"python -m transformer.lab.isoflop_refit {args.sweep} --seed_noise="
                   f"{args.seed_noise} --bootstrap={args.bootstrap} --record")
        records.append(RECORDS, records.record(
            {"cpu": f"any ({platform.machine()}): no training, a refit of recorded losses",
             "cores": os.cpu_count()}, command, [0],
            figures, note="refit of the recorded members, no training: N as the FLOP count "
            "counts it (compute-equivalent C/(6D)); the other counts as columns"))


if __name__ == "__main__":
    main()

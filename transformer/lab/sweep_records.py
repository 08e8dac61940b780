"""One record per finished member of a sweep's workdir, appended to docs/records/scaling.jsonl.

    python -m transformer.lab.sweep_records runs/isoflop_rules \
        --command="python -m transformer scaling --sweep=configs/scaling/cpu_isoflop_rules.py \
--workdir=runs/isoflop_rules --allow_change=variants --no_progress" --note="..."

A member already recorded under the same command is skipped, so the tool runs again as a sweep
goes on; `--only=seed=1_` records only the members of that seed (a retrained member of an
earlier seed that reproduced its record needs none). The record holds the member's name (with its seed variant, seed=<s>_..., for seeds
after the first), its seed, its parameter counts (non-embedding, all, compute-equivalent
C/(6D)), tokens, steps, counted FLOPs and final val loss (nats per token) and bits per byte:
what transformer/lab/isoflop_refit.py refits from, without the run folders.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformer import host
from transformer.lab import records
from transformer.lab.isoflop_refit import RECORDS
from transformer.model.sizes import human
from transformer.scaling import report


def member_records(workdir, command: str, note: str, path=RECORDS,
                   only: str = "") -> list[dict]:
    """The records of `workdir`'s finished members not yet recorded under `command` (with
    `only`, those whose name starts with it)."""
    done = {(r["command"], r["result"].get("run")) for r in records.read(Path(path))} \
        if Path(path).is_file() else set()
    out = []
    machine = {"cpu": host.cpu_line(), "cores": host.usable_cores()}
    for r in report.collect(workdir):
        if (command, r["name"]) in done or not r["name"].startswith(only):
            continue
        seed = r.get("seed") or 0
        out.append(records.record(machine, command, [seed], dict(
            run=r["name"], seed=seed, non_emb_params=human(r["params_non_embedding"]),
            total_params=human(r["params_total"]),
            compute_equiv_params=human(r["flops"] / (6 * r["tokens"])),
            tokens=human(r["tokens"]), steps=r["steps"], flops=float(f"{r['flops']:.4g}"),
            val_loss=round(r["val_loss"], 4), val_bpb=round(r["val_bpb"], 4)), note=note))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--command", required=True, help="the command that trained them")
    parser.add_argument("--note", default="")
    parser.add_argument("--only", default="", help="only members whose name starts with it")
    args = parser.parse_args(argv)
    new = member_records(args.workdir, args.command, args.note, only=args.only)
    for rec in new:
        records.append(RECORDS, rec)
    print(f"appended {len(new)} member records to {RECORDS}")
    print(json.dumps([r["result"]["run"] for r in new]))


if __name__ == "__main__":
    main()

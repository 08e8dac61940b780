"""The speedrun's rows over seeds: run a row's command once per seed, then its mean, spread and
the p-value of its claimed improvement over the row it is compared with.

    python -m transformer.lab.speedrun_rows --rows=18,19 --seeds=0,1,2 --work=runs/speedrun
    python -m transformer.lab.speedrun_rows --rows=18,19 --work=runs/speedrun \\
        --record=docs/records/speedrun.jsonl         # and append one record per row

The rows are docs/speedrun.md's table: its `command` column, run from the project's root as
`python train.py ... --workdir=WORK/row<#>-s<seed> --config.train.seed=<seed>`, one run after
the other (a finished run, one whose workdir has a final evaluation, is read, not re-run, so an
interrupted study resumes). A row's loss is its final evaluation (the whole validation split) in nats per byte,
`val_bpb` × ln 2, the unit in which byte and BPE rows compare.
Its `vs` column names the row it is compared with; the p-value is Welch's t-test, one-sided,
that this row's mean loss is lower than that row's (scipy.stats.ttest_ind, equal_var=False,
alternative="less"), from the two rows' seeds as run here or as their records have them.
Run it on a machine that nothing else uses if the training times matter; the losses do not
depend on the machine's load (a row is a fixed number of steps).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "speedrun.md"
TRAINED = re.compile(r"trained steps \d+\.\.(\d+) in ([\d.]+)s")


def table(page: Path = PAGE) -> list[dict]:
    """docs/speedrun.md's rows, each {column: cell} with the command's backticks removed."""
    section = page.read_text().split("## The rows")[1].split("\n## ")[0]  # to the next heading
    head, *rows = [line for line in section.splitlines()
                   if line.startswith("| ") and "---" not in line]
    cols = [c.strip() for c in head.strip("|").split("|")]
    out = []
    for row in rows:
        cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
        cells["command"] = cells["command"].strip("`")
        out.append(cells)
    return out


def finished(workdir: Path) -> dict | None:
    """{val_loss (nats per byte), steps, train_s} of a finished run in `workdir`, or None.
    Finished: its log says `trained steps 0..N` and its metrics have an evaluation at step N."""
    metrics, log = workdir / "metrics.jsonl", workdir / "train.log"
    if not metrics.exists() or not log.exists():
        return None
    timed = TRAINED.findall(log.read_text())
    if not timed:
        return None
    steps, train_s = int(timed[-1][0]), float(timed[-1][1])
    evals = [m for m in map(json.loads, filter(str.strip, metrics.read_text().splitlines()))
             if "val_bpb" in m and m.get("step") == steps]
    if not evals:
        return None
    return {"val_loss": evals[-1]["val_bpb"] * math.log(2), "steps": steps, "train_s": train_s}


def run(command: str, workdir: Path, seed: int) -> dict:
    """Runs one row's command for one seed (unless it already finished there)."""
    done = finished(workdir)
    if done:
        return done
    print(f"... {workdir.name}: {command}", flush=True)
    args = command.split()
    if args[:2] != ["python", "train.py"]:
        raise SystemExit(f"error: a row's command must start `python train.py`: {command}")
    cmd = [sys.executable, "train.py", *args[2:], f"--workdir={workdir}",
           f"--config.train.seed={seed}", "--no_progress"]
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "train.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    done = finished(workdir)
    if rc or not done:
        raise SystemExit(f"error: {' '.join(cmd[1:])} exited {rc}; see {workdir}/train.log")
    return done


def welch_less(a: list[float], b: list[float]) -> float | None:
    """One-sided Welch p-value that mean(a) < mean(b); None with fewer than 2 of either."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats
    p = stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue
    return None if math.isnan(p) else float(p)


def summary(losses: list[float]) -> dict:
    mean = sum(losses) / len(losses)
    return {"mean": mean, "spread": max(losses) - min(losses),
            "std": (sum((x - mean) ** 2 for x in losses) / (len(losses) - 1)) ** 0.5
            if len(losses) > 1 else None}


def row_records(path) -> dict:
    """{row #: its latest record} of a speedrun records file (notes `speedrun row #: ...`)."""
    from transformer.lab import records
    out = {}
    for rec in records.read(Path(path)):
        if rec["note"].startswith("speedrun row "):
            out[rec["note"].split(":")[0].removeprefix("speedrun row ")] = rec
    return out


def losses_of(rec: dict) -> list[float]:
    return [rec["result"][f"val_loss_seed{s}"] for s in rec["seeds"]]


def cells(row: dict, recs: dict) -> dict:
    """The figures a table row quotes from the records: seeds, val loss, spread and p."""
    rec = recs[row["#"]]
    losses = losses_of(rec)
    s = summary(losses)
    seeds = ", ".join(map(str, rec["seeds"]))
    p = welch_less(losses, losses_of(recs[row["vs"]])) if row.get("vs") in recs else None
    return {"seeds": seeds if len(losses) > 1 else f"{seeds} (1 seed)",
            "val loss": f"{s['mean']:.4f}",
            "spread": f"{s['spread']:.4f}" if len(losses) > 1 else "—",
            "p": "—" if p is None else f"{p:.2g}"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", required=True, help="row numbers from the table, e.g. 18,19")
    parser.add_argument("--seeds", default="0,1,2", help="seeds to run (default 0,1,2)")
    parser.add_argument("--work", default="runs/speedrun", help="one workdir per row and seed")
    parser.add_argument("--record", help="append one record per row to this JSON Lines file")
    parser.add_argument("--note", default="", help="appended to each record's note (e.g. the "
                        "machine's load, which makes the training times incomparable)")
    args = parser.parse_args(argv)
    rows = {r["#"]: r for r in table()}
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in rows]
    if unknown:
        print(f"error: --rows: no row {', '.join(unknown)} in docs/speedrun.md (rows: "
              f"{', '.join(rows)})", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds={args.seeds}: give integers, e.g. --seeds=0,1,2", file=sys.stderr)
        return 2
    work = Path(args.work).resolve()
    results = {}
    for name in wanted:
        command = rows[name]["command"]
        for seed in seeds:
            # A row whose command is another's (a code change: the same flags, today's code)
            # reads that row's finished run rather than repeating it.
            twins = [work / f"row{other}-s{seed}" for other, r in rows.items()
                     if r["command"] == command and other != name]
            done = next(filter(None, map(finished, twins)), None)
            if done is None:
                done = run(command, work / f"row{name}-s{seed}", seed)
            results.setdefault(name, {})[seed] = done
    for name, by_seed in results.items():
        s = summary([r["val_loss"] for r in by_seed.values()])
        print(f"row {name}: {s['mean']:.4f} over seeds {list(by_seed)}, spread {s['spread']:.4f}")
        if args.record:
            append_record(args.record, rows[name], by_seed, args.note)
    if args.record:
        recs = row_records(args.record)
        for name in results:
            if rows[name].get("vs") in recs:
                print(f"row {name} against row {rows[name]['vs']}: p = "
                      f"{cells(rows[name], recs)['p']} (one-sided Welch, lower loss)")
    return 0


def append_record(path, row: dict, by_seed: dict, note: str = "") -> None:
    from transformer import host
    from transformer.lab import records
    result = {f"val_loss_seed{s}": round(r["val_loss"], 4) for s, r in by_seed.items()}
    steps = {r["steps"] for r in by_seed.values()}
    result["steps"] = steps.pop() if len(steps) == 1 else None
    result["train_s"] = ", ".join(f"{r['train_s']:.1f}" for r in by_seed.values())
    machine = {"cpu": host.cpu_line(), "cores": host.usable_cores()}
    records.append(path, records.record(
        machine, row["command"], list(by_seed), result,
        f"speedrun row {row['#']}: {row['change over the row above']}" + (f"; {note}" * bool(note))))


if __name__ == "__main__":
    sys.exit(main())

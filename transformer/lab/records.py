"""Dated measurements: docs/records/*.jsonl rendered as the tables of docs/records.md.

    python -m transformer.lab.records            # rewrite docs/records.md from the records
    python -m transformer.lab.records --check    # exit 1 if docs/records.md is stale

A record is one JSON object a line, one file per kind (quickstart, side_by_side, bench,
suite, server, data, performance, scaling, speedrun, compile): `date`, `machine` (`cpu`,
`cores`, and from issue 57 on the `python` and `jax` versions that made the figure: the
quick start's corpus is the running Python's standard library), `command`, `seeds`, `result`
(the figures, a flat object) and `note`. The measuring
tools append with `append` (their `--record=PATH` flag); nothing is edited by hand but the notes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "records"
PAGE = ROOT / "docs" / "records.md"
ACCELERATORS = ROOT / "docs" / "accelerators.md"  # its table of compile records
KINDS = {
    "quickstart": "The quick start: `train.py` with configs/default.py",
    "side_by_side": "Side by side with nanoGPT's CPU recipe and with nanochat, on the same text",
    "bench": "The bench against the PyTorch peer (`python -m transformer bench`)",
    "suite": "The test suite (`python -m pytest`, from a clean clone unless the note says)",
    "server": "The server under concurrent clients (`python -m transformer.serve.measure`)",
    "data": "Data: prepare's speed and memory, the loader, the validation split (docs/data.md)",
    "performance": "Step-cost, profile and decoding experiments (docs/performance.md)",
    "scaling": "Scaling studies: ladders, IsoFLOP, variants, lr transfer (docs/scaling.md)",
    "speedrun": "The speedrun's rows and screens (docs/speedrun.md; `val_loss` in nats per byte)",
    "compile": "Compiled for TPU and GPU targets on this CPU (`python -m transformer compile`, "
               "docs/accelerators.md)",
}
KEYS = ("date", "machine", "command", "seeds", "result", "note")
# What `machine` holds: rows written before issue 57 name only the CPU.
MACHINE_KEYS = ({"cpu", "cores"}, {"cpu", "cores", "python", "jax"})


def versions() -> dict:
    """{"python", "jax"}: this process's, as a record's figures were made by it (or by children
    started with its interpreter). The jax version is read from the installed package's
    metadata, without importing it."""
    try:
        jax = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        jax = "none"
    return {"python": platform.python_version(), "jax": jax}


def record(machine: dict, command: str, seeds: list, result: dict, note: str = "",
           date: str | None = None) -> dict:
    """One record in the schema; the date defaults to now (UTC, to the minute); the machine's
    Python and JAX versions are this process's unless `machine` names them."""
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    machine = {"cpu": machine["cpu"], "cores": machine["cores"],
               **{k: machine.get(k, v) for k, v in versions().items()}}
    return {"date": date, "machine": machine,
            "command": command, "seeds": list(seeds), "result": dict(result), "note": note}


def append(path, rec: dict) -> None:
    """Appends one record as one line (the file and its folder are made if missing)."""
    problem = check(rec)
    if problem:
        raise ValueError(problem)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def check(rec) -> str | None:
    """Why a record breaks the schema, or None."""
    if not isinstance(rec, dict) or tuple(rec) != KEYS:
        return f"keys must be {', '.join(KEYS)} in that order"
    if not str(rec["date"])[:10].count("-") == 2:
        return "date must start YYYY-MM-DD"
    if not isinstance(rec["machine"], dict) or set(rec["machine"]) not in MACHINE_KEYS:
        return "machine must be {cpu, cores, python, jax} ({cpu, cores} in old rows)"
    if not isinstance(rec["seeds"], list) or not isinstance(rec["result"], dict):
        return "seeds must be a list and result an object"
    if any(isinstance(v, (dict, list)) for v in rec["result"].values()):
        return "result must be flat (numbers and text)"
    return None


def read(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        problem = check(rec)
        if problem:
            raise ValueError(f"{path.name}:{n}: {problem}")
        out.append(rec)
    return out


def _cell(value) -> str:
    if isinstance(value, float):
        value = f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(folder: Path | None = None) -> str:
    """docs/records.md's text: a table per kind, its records in file order."""
    folder = folder or FOLDER
    lines = ["# Records: dated measurements", "",
             "Generated by `python -m transformer.lab.records` from `docs/records/*.jsonl`"
             " (one JSON object a line); do not edit this page, edit or append to the records.",
             "The README and the docs pages quote rounded figures and link here."]
    for kind, title in KINDS.items():
        path = folder / f"{kind}.jsonl"
        if not path.exists():
            continue
        lines += ["", f"## {title}", "", f"`docs/records/{kind}.jsonl`", "",
                  "| date | machine | command | seeds | result | note |", "|---|---|---|---|---|---|"]
        for rec in read(path):
            m = rec["machine"]
            machine = f"{m['cpu']}, {m['cores']} cores" + (
                f", Python {m['python']}, JAX {m['jax']}" if "python" in m else "")
            result = "; ".join(f"{k}: {_cell(v)}" for k, v in rec["result"].items())
            seeds = ", ".join(map(str, rec["seeds"])) or "-"
            command = f"`{rec['command']}`" if rec["command"] else "-"
            lines.append("| " + " | ".join(_cell(c) for c in (
                rec["date"], machine, command, seeds, result, rec["note"])) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/records.md differs from the records")
    args = parser.parse_args(argv)
    from transformer.lab import accelerators_table
    try:
        text = render()
        compiled = FOLDER / "compile.jsonl"
        pages = {PAGE: text, ACCELERATORS: accelerators_table.rewrite(
            ACCELERATORS.read_text(encoding="utf-8"), read(compiled) if compiled.exists() else [])}
    except (ValueError, json.JSONDecodeError) as e:
        print(f"error: docs/records: {e}", file=sys.stderr)
        return 1
    if args.check:
        for page, want in pages.items():
            if not page.exists() or page.read_text(encoding="utf-8") != want:
                print(f"error: docs/{page.name} is stale: run python -m transformer.lab.records",
                      file=sys.stderr)
                return 1
        return 0
    for page, want in pages.items():
        page.write_text(want, encoding="utf-8")
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

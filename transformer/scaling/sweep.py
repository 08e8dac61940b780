"""Scaling sweeps: train a ladder of model sizes under a budget, then fit how loss scales.

    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder
    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder --index=2
    python -m transformer scaling --workdir=runs/ladder --report
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=1e15
    python -m transformer scaling --workdir=runs/isoflop --verify     # train the prediction

A sweep config (see `configs/scaling/`) holds a base training config, a list of sizes (from
`ladder`, one sizing rule) and a budget per run:
    tokens      every run sees `value` tokens
    flops       IsoFLOP: tokens = value / (training FLOPs per token of that size)
    chinchilla  tokens = value × non-embedding params (Hoffmann et al. 2022 use ~20)
Each budget value × size is a member: an ordinary training run in <workdir>/<name>, so it can
be sampled, resumed and plotted like any other. A finished member (it has `result.json`) is
skipped; a partial one resumes from its checkpoint. `--index=i` runs member i alone, so a
scheduler can fan the sweep out; the report then gathers whatever has finished.

The report writes report.csv, report.md, fit.json and three PNGs into the workdir:
loss_vs_params.png, loss_vs_compute.png and loss_curves.png; an IsoFLOP sweep (budget kind
`flops`) adds Chinchilla's approaches 2 and 3 with bootstrap intervals, the compute-optimal
size at its largest budget and isoflop.png (transformer/scaling/isoflop.py). A sweep with `variants`
(e.g. from `grid`) repeats the ladder per variant and fits one curve per group.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import time
from pathlib import Path

import ml_collections
import numpy as np

from transformer.config import ConfigError, ModelConfig, fields, flatten, validate
from transformer.model import flops
from transformer.model.sizes import human, model_config_of
from transformer.scaling import fit, plot
from transformer.train.metrics import MetricsLog

BUDGETS = ("tokens", "flops", "chinchilla")


def ladder(n_layers, aspect: int, head_dim: int, mlp_ratio: int = 4) -> list[dict]:
    """The sizing rule: d_model = aspect × n_layers, heads of `head_dim`, d_ff = mlp_ratio ×
    d_model. A fixed aspect ratio grows width and depth together, as Kaplan et al. found best."""
    sizes = []
    for L in n_layers:
        d = aspect * L
        if d % head_dim:
            raise ConfigError(f"ladder: d_model={d} (aspect {aspect} × {L} layers) is not a "
                              f"multiple of head_dim={head_dim}")
        sizes.append(dict(name=f"L{L}-d{d}", n_layers=L, d_model=d, n_heads=d // head_dim,
                          d_ff=mlp_ratio * d))
    return sizes


def sweep_config(base, sizes, budget_kind: str, budgets, variants=()) -> ml_collections.ConfigDict:
    """What a sweep config file's get_config() returns: `budgets` are token counts, FLOP
    counts or tokens per parameter, as `budget_kind` says. `variants` (optional, see `grid`)
    repeat the whole ladder once per variant: {"name": ..., "group": ..., "model.x": value}."""
    s = ml_collections.ConfigDict()
    s.base = base
    s.sizes = [dict(size) for size in sizes]
    s.budget_kind = budget_kind
    s.budgets = tuple(budgets)
    s.variants = [dict(v) for v in variants]
    return s


def grid(axes: dict) -> list[dict]:
    """Variants for every combination of config values, e.g.
    grid({"model.position": ["learned", "rope"], "train.lr": [1e-3, 3e-3]}) gives 4, named
    "position=rope_lr=0.003". An lr axis is tuned, not compared: members that differ only in
    train.lr share a group, and the report keeps the best lr per size of each group."""
    fields = list(axes)
    out = []
    for values in itertools.product(*(axes[f] for f in fields)):
        parts = [f"{f.split('.')[-1]}={v:g}" if isinstance(v, float) else
                 f"{f.split('.')[-1]}={v}" for f, v in zip(fields, values)]
        group = [p for f, p in zip(fields, parts) if f != "train.lr"]
        out.append({"name": "_".join(parts), "group": "_".join(group) or "all",
                    **dict(zip(fields, values))})
    return out


def _apply_variant(config, variant: dict) -> None:
    for field, value in variant.items():
        if field in ("name", "group"):
            continue
        section, _, key = field.partition(".")
        if section not in config or key not in config[section]:
            raise ConfigError(f"sweep variant {variant.get('name')!r}: {field} is not a config "
                              "field; name fields as section.field, e.g. model.position")
        config[section][key] = value


@dataclasses.dataclass
class Member:
    index: int
    name: str
    config: ml_collections.ConfigDict
    budget: str
    value: float
    group: str = ""

    @property
    def tokens(self) -> int:
        return self.config.train.steps * self.config.train.batch_size * \
            self.config.model.max_seq_len


SWEEP_KEYS = ("base", "sizes", "budget_kind", "budgets")


def check(sweep) -> None:
    """Refuses what is not a sweep config (a run config given as --sweep, above all) and
    budgets that cannot train anything, each with one line."""
    keys = set(sweep.keys())
    if not set(SWEEP_KEYS) <= keys:
        if {"model", "train", "data"} & keys:
            raise ConfigError("--sweep: this is a run config (it has model/train/data "
                              "sections), not a sweep config: train it with train.py "
                              "--config=FILE, or give a sweep config such as "
                              "configs/scaling/cpu_ladder.py")
        missing = ", ".join(k for k in SWEEP_KEYS if k not in keys)
        raise ConfigError(f"--sweep: not a sweep config (it lacks {missing}); get_config() "
                          "returns sweep_config(base, sizes, budget_kind, budgets), see "
                          "configs/scaling/")
    kind = sweep.budget_kind
    if kind not in BUDGETS:
        raise ConfigError(f"sweep.budget_kind={kind!r}: must be one of {', '.join(BUDGETS)}")
    if not sweep.sizes or not sweep.budgets:
        raise ConfigError("sweep.sizes and sweep.budgets must not be empty")
    for value in sweep.budgets:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise ConfigError(f"sweep.budgets={tuple(sweep.budgets)!r}: every budget must be a "
                              f"positive number ({kind}), not {value!r}")


def members(sweep) -> list[Member]:
    """Every run of the sweep, budgets outer, sizes inner (small to large)."""
    check(sweep)
    kind = sweep.budget_kind
    out = []
    variants = list(sweep.get("variants") or []) or [{"name": ""}]
    for variant, value, size in itertools.product(variants, sweep.budgets, sweep.sizes):
        config = ml_collections.ConfigDict(sweep.base.to_dict())
        _apply_variant(config, variant)
        config.model.update({k: v for k, v in size.items() if k != "name"})
        model = model_config_of(ml_collections.ConfigDict(config.to_dict()))  # vocab 0 stays
        if kind == "tokens":
            tokens = value
        elif kind == "flops":
            tokens = value / flops.train_flops_per_token(model)
        else:
            tokens = value * flops.param_counts(model)["non_embedding"]
        tokens_per_step = config.train.batch_size * config.model.max_seq_len
        config.train.steps = max(1, round(tokens / tokens_per_step))
        tag = {"tokens": f"tok{human(value)}", "chinchilla": f"x{value:g}",
               "flops": f"flop{value:.1e}".replace("e+", "e")}[kind]
        name = "_".join(p for p in (variant["name"], size["name"], tag) if p)
        group = variant.get("group", variant["name"])
        out.append(Member(len(out), name, validate(config), kind, value, group))
    return out


def differences(saved: dict, current: dict) -> dict:
    """{key: (saved, current)} for every key of two sweep dicts that differs, nested keys
    dotted ("budgets", "sizes", "base.train.lr"); a key only one side has differs too."""
    saved, current = flatten(saved), flatten(current)
    return {k: (saved.get(k, "(absent)"), current.get(k, "(absent)"))
            for k in sorted(set(saved) | set(current)) if saved.get(k, _ABSENT) !=
            current.get(k, _ABSENT)}


_ABSENT = object()


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_workdir(sweep, workdir, allow_change=()) -> dict | None:
    """Refuses a workdir that holds another sweep (or a changed base) unless every differing
    key is named in `allow_change`; also one that holds a training run. Returns the
    differences that were allowed (None when the workdir is new or holds this very sweep)."""
    workdir = Path(workdir)
    saved = _sweep_of(workdir)
    if saved is None:
        if (workdir / "checkpoints").is_dir():
            raise ConfigError(f"--workdir={workdir} holds a training run, not a sweep: give "
                              "the sweep a folder of its own")
        return None
    # Base fields free to change on a resumed run (logging, evaluation, checkpoints, mesh,
    # the sample) change nothing a member computes: not a different sweep.
    diffs = {k: v for k, v in differences(saved, json.loads(sweep.to_json())).items()
             if not (k.startswith("base.") and k[5:] in fields.BY_NAME
                     and fields.BY_NAME[k[5:]].resume == fields.FREE)}
    if not diffs:
        return None
    refused = {k: v for k, v in diffs.items() if k not in set(allow_change or ())}
    if refused:
        shown = list(refused.items())[:3]
        what = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in shown)
        if len(refused) > len(shown):
            what += f"; and {', '.join(list(refused)[len(shown):])}"
        raise ConfigError(f"{workdir} holds another sweep ({what}): use a new --workdir, or "
                          f"pass --allow_change={','.join(refused)} to replace its sweep.json "
                          "(members already finished keep the results of the old one)")
    return diffs


def run(sweep, workdir, index=None, log=print, progress: bool = True,
        allow_change=()) -> list[str]:
    """Trains the members not yet finished (or only member `index`). Returns those trained.
    A workdir holding another sweep is refused unless the differing keys of the sweep config
    (e.g. budgets, base.train.lr) are named in `allow_change`."""
    all_members = members(sweep)
    if index is not None and not 0 <= index < len(all_members):
        raise ConfigError(f"--index={index}: the sweep has members 0..{len(all_members) - 1}")
    workdir = Path(workdir)
    allowed = check_workdir(sweep, workdir, allow_change)
    if allowed:
        log(f"{workdir}: sweep changed as allowed ({', '.join(allowed)}); finished members "
            "are kept as they are")
    from transformer.train.run import train  # jax, flax, optax: not needed for --report
    from transformer.train.start import resolve
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(workdir / "sweep.json", json.dumps(
        {"sweep": json.loads(sweep.to_json()), "members": [m.name for m in all_members]},
        indent=1))
    chosen = all_members if index is None else [all_members[index]]
    trained = []
    for m in chosen:
        run_dir = workdir / m.name
        result = _read_json(run_dir / "result.json")
        if result and result["steps"] == m.config.train.steps:
            log(f"[{m.index + 1}/{len(all_members)}] {m.name}: finished, skipped")
            continue
        log(f"[{m.index + 1}/{len(all_members)}] {m.name}: {m.config.train.steps} steps, "
            f"{m.tokens:,} tokens")
        started = time.perf_counter()
        _, tokenizer = train(m.config, run_dir, log=log, progress=progress)
        wall_s = time.perf_counter() - started
        model = ModelConfig.from_config(resolve(m.config, tokenizer))  # vocab 0 filled
        counts = flops.param_counts(model)
        write_atomic(run_dir / "result.json", json.dumps(dict(
            name=m.name, index=m.index, budget=m.budget, budget_value=m.value,
            n_layers=model.n_layers, d_model=model.d_model, steps=m.config.train.steps,
            tokens=m.tokens, params_total=counts["total"],
            params_non_embedding=counts["non_embedding"],
            flops=flops.train_flops_per_token(model) * m.tokens, wall_s=wall_s,
            group=m.group), indent=1))
        trained.append(m.name)
    return trained


def _sweep_of(workdir):
    """The sweep config saved with the runs (its sizes define the ladder), or None."""
    return (_read_json(Path(workdir) / "sweep.json") or {}).get("sweep")


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to `path` so that a reader (or a kill mid-write) sees the old file or the
    new one, never half of it: a temporary file beside it, then os.replace. The name carries
    the process id: members of one sweep may run in parallel (--index)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


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


def best_per_size(rows) -> list[dict]:
    """One row per (group, budget, size): the lowest val loss, so that members differing only
    in a tuned field (train.lr) count once, at their best value, in every fit."""
    best = {}
    for r in rows:
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
        lines.append(f"{name}: " + (fit.describe(f, x) if f else "not enough points to fit"))
    if len(budgets) > 1 and largest:
        lines.append(f"(L(N) uses the {len(largest)} runs of the largest budget)")
    if largest:
        lines.append("val loss falls monotonically with size: "
                     + ("yes" if _monotonic(largest) else "NO"))
    return fits, lines


def _isoflop_section(workdir, ok, holdout, n_boot) -> tuple[dict, list[str]]:
    from transformer.scaling import isoflop
    runs = isoflop.runs_of(ok)
    fits = isoflop.fit_all(runs, n_boot, _sweep_of(workdir))
    lines = ["", *isoflop.describe(fits)]
    if fits["a3"] is not None:
        largest = max(r["budget"] for r in runs)
        lines += ["", *isoflop.prediction_lines(fits, largest, _sweep_of(workdir))]
    if holdout:
        lines += ["", *isoflop.holdout_lines(runs, holdout, n_boot)]
    png = isoflop.plot_isoflop(runs, fits, workdir / "isoflop.png")
    lines.append(f"wrote {png}")
    summary = {"approach2": {k: v for k, v in (fits["a2"] or {}).items() if k != "budgets"},
               "approach3": fits["a3"]}
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
    fitted = {r["group"] for r in ok}
    groups = [g for g in dict.fromkeys(r["group"] for r in rows) if g in fitted]
    by_group = {}
    for g in groups:
        fits, fit_lines = _fits([r for r in ok if r["group"] == g])
        if rows[0]["budget"] == "flops" and len(groups) == 1:
            fits["isoflop"], iso_lines = _isoflop_section(workdir, ok, holdout, n_boot)
            fit_lines += iso_lines
        by_group[g] = fits
        lines += ["", *([f"## {g}", ""] if len(groups) > 1 else []), *fit_lines]
    if len(groups) > 1:
        lines += ["", *gap_table(ok, groups)]
    fits = by_group[groups[0]] if len(groups) == 1 else by_group
    write_atomic(workdir / "fit.json", json.dumps(fits, indent=1, default=float))
    if missing:
        lines.append(f"not finished yet: {', '.join(missing)}")
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
    ok = best_per_size([r for r in collect(workdir) if math.isfinite(r["val_loss"])])
    if not ok or ok[0]["budget"] != "flops":
        raise ConfigError(f"--predict: {workdir} holds no finished IsoFLOP runs "
                          "(sweep.budget_kind='flops'); run such a sweep first")
    fits = isoflop.fit_all(isoflop.runs_of(ok), n_boot, _sweep_of(workdir))
    log("\n".join(isoflop.prediction_lines(fits, flops_budget, _sweep_of(workdir))))
    return isoflop.optimum(fits, flops_budget)


def budget_label(kind: str, value: float) -> str:
    return {"tokens": f"{human(value)} tokens", "flops": f"{value:.1e} FLOPs",
            "chinchilla": f"{value:g} tokens/param"}[kind]


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


def _main():
    from absl import flags
    from ml_collections import config_flags

    from transformer import cli

    sweep_flag = config_flags.DEFINE_config_file("sweep", None, "A sweep config file "
                                                 "(configs/scaling/*.py).")
    workdir_flag = flags.DEFINE_string("workdir", None, "Folder of the sweep; a run per member.")
    index_flag = flags.DEFINE_integer("index", None, "Run only member i (0-based).")
    report_flag = flags.DEFINE_bool("report", False, "Only write the report of finished runs.")
    no_progress = flags.DEFINE_bool("no_progress", False, "Hide the progress bars.")
    predict_flag = flags.DEFINE_bool("predict", False, "Print the compute-optimal N, D and "
                                     "loss at --flops from the IsoFLOP runs in --workdir.")
    flops_flag = flags.DEFINE_float("flops", None, "The training budget for --predict (and "
                                    "--verify: default 4x the sweep's largest).")
    verify_flag = flags.DEFINE_bool("verify", False, "Train the compute-optimal run the "
                                    "IsoFLOP fits predict at --flops (default 4x the largest "
                                    "budget) and print measured vs predicted loss.")
    holdout_flag = flags.DEFINE_string("holdout", None, "With --report: 'largest' refits "
                                       "without the largest budget and checks its runs.")
    boot_flag = flags.DEFINE_integer("bootstrap", 100, "Bootstrap resamples per interval.")
    allow_flag = flags.DEFINE_list("allow_change", [], "Keys of the sweep config that may "
                                   "differ from the workdir's sweep.json, e.g. budgets or "
                                   "base.train.lr (finished members are kept).")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        if not workdir_flag.value:
            cli.fail("--workdir=PATH is required")
        if verify_flag.value:
            if flops_flag.value is not None and flops_flag.value <= 0:
                cli.fail("--verify --flops=C: the budget must be positive")
            from transformer.scaling import verify
            verify.verify(workdir_flag.value, flops_flag.value, n_boot=boot_flag.value,
                          progress=not no_progress.value)
            return
        if predict_flag.value:
            if not flops_flag.value or flops_flag.value <= 0:
                cli.fail("--predict needs --flops=C, a positive budget, e.g. --flops=1e15")
            predict(workdir_flag.value, flops_flag.value, n_boot=boot_flag.value)
            return
        if holdout_flag.value not in (None, "largest"):
            cli.fail(f"--holdout={holdout_flag.value}: only --holdout=largest is supported")
        if report_flag.value:
            report(workdir_flag.value, holdout=holdout_flag.value, n_boot=boot_flag.value)
            return
        if flags.FLAGS["sweep"].value is None:
            cli.fail("--sweep=PATH is required to run a sweep (or pass --report)")
        sweep = cli.config_value(sweep_flag)
        run(sweep, workdir_flag.value, index_flag.value, progress=not no_progress.value,
            allow_change=allow_flag.value)
        if index_flag.value is None:
            report(workdir_flag.value)
        else:
            print(f"report: python -m transformer scaling --workdir={workdir_flag.value} --report")

    cli.run(main)


if __name__ == "__main__":
    _main()

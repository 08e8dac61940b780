"""The lr-transfer figures and tables of docs/scaling.md, from a finished (or partial) sweep:
across widths under the width rule (configs/scaling/lr_transfer.py), or across depths under
the depth rules (configs/scaling/depth_lr_transfer.py, with --depth).

    python -m transformer scaling --sweep=configs/scaling/lr_transfer.py --workdir=runs/lr_transfer
    python -m transformer.lab.lr_transfer runs/lr_transfer docs/lr_transfer.png  # + its tables

    python -m transformer scaling --sweep=configs/scaling/depth_lr_transfer.py \\
        --workdir=runs/depth_lr_transfer
    python -m transformer.lab.lr_transfer --depth runs/depth_lr_transfer \\
        docs/depth_lr_transfer.png                                       # + its table

Widths: final val loss against the peak lr, one curve per size, left without the width rule
(train.lr_base_width=0), right with it (16: the smallest width). At the base width the rule's
multiplier is 1.0, so a size-16 member is the same run under both (bitwise,
tests/test_width_lr.py): where the sweep skipped one, the right panel uses its twin.

Depths: final val loss (nats per byte: val_bpb × ln 2) against the multiplier on both of the
base's rates, one curve per depth, each depth's rates derived by config/depth.py.
"""

import argparse
import json
import math
import re
from pathlib import Path

from transformer.scaling.plot import _pyplot
from transformer.scaling.report import collect

NAME = re.compile(r"lr_base_width=(\d+)_lr=([0-9.e+-]+)_L\d+-d(\d+)_")
DEPTH_NAME = re.compile(r"lrx([0-9.e+-]+)_D(\d+)_")


def best(curve: dict):
    """The x of a curve {x: loss} with the lowest loss (nan for an empty curve)."""
    return min(curve, key=curve.get) if curve else math.nan


def cells(curve: dict, xs) -> list[str]:
    """A table row's loss cells at `xs`, the curve's best in bold, '-' where it has none."""
    top = best(curve)
    return [(f"**{curve[x]:.4f}**" if x == top else f"{curve[x]:.4f}") if x in curve else "-"
            for x in xs]


def worst_excess(curves, xs) -> list[str]:
    """What one x costs a ladder: at each x, the largest excess of a curve's loss over that
    curve's own best ('-' where a curve lacks the x)."""
    return [f"{max(c[x] - min(c.values()) for c in curves):+.4f}"
            if all(x in c for c in curves) else "-" for x in xs]


def draw(ax, curves, xlabel: str) -> None:
    """[(label, curve)] on one log2 axis, small to large in viridis, a star at each best."""
    plt = _pyplot()
    colours = plt.cm.viridis([i / max(len(curves) - 1, 1) * 0.85 for i in range(len(curves))])
    for (label, curve), colour in zip(curves, colours):
        if not curve:
            continue
        xs = sorted(curve)
        ax.plot(xs, [curve[x] for x in xs], "o-", color=colour, label=label)
        top = best(curve)
        ax.plot([top], [curve[top]], "*", color=colour, markersize=16, markeredgecolor="black")
    ax.set_xscale("log", base=2)
    ticks = sorted({x for _, curve in curves for x in curve})
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks], rotation=45)
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


# Widths: the width rule off and on (configs/scaling/lr_transfer.py).

def losses(workdir) -> dict:
    """{(lr_base_width, d_model): {lr: final val loss}} of the finished members."""
    out: dict = {}
    for row in collect(workdir):
        w, lr, d = NAME.match(row["name"]).groups()
        out.setdefault((int(w), int(d)), {})[float(lr)] = row["val_loss"]
    widths = sorted({d for _, d in out})
    sweep = json.loads((Path(workdir) / "sweep.json").read_text())["sweep"]
    rule = max(v["train.lr_base_width"] for v in sweep["variants"])
    for lr, loss in out.get((0, rule), {}).items():  # the twins at the base width
        out.setdefault((rule, rule), {}).setdefault(lr, loss)
    return {k: out[k] for k in sorted(out)}, widths, rule


def _rule(w) -> str:
    return "off" if w == 0 else f"lr_base_width={w}"


def table(data, widths, rule) -> str:
    lrs = sorted({lr for curve in data.values() for lr in curve})
    lines = ["| rule | d_model | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
             "|---|---|" + "---|" * (len(lrs) + 1)]
    for w in (0, rule):
        for d in widths:
            curve = data.get((w, d), {})
            lines.append(f"| {_rule(w)} | {d} | " + " | ".join(cells(curve, lrs)) +
                         f" | {best(curve):g} |")
    return "\n".join(lines)


def one_lr(data, widths, rule) -> str:
    """What a ladder pays for training every size at one lr: for each lr and rule, the worst
    excess of a size's loss over that size's best (over the lrs tried)."""
    lrs = sorted({lr for curve in data.values() for lr in curve})
    lines = ["| rule | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
             "|---|" + "---|" * len(lrs)]
    for w in (0, rule):
        curves = [data.get((w, d), {}) for d in widths]
        lines.append(f"| {_rule(w)} | " + " | ".join(worst_excess(curves, lrs)) + " |")
    return "\n".join(lines)


def figure(data, widths, rule, out) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, w, title in ((axes[0], 0, "without the rule: every matrix at lr"),
                         (axes[1], rule, f"with the rule: hidden matrices at lr·{rule}/d_model")):
        draw(ax, [(f"d_model {d} ({d // 16} layer{'s' * (d > 16)})", data.get((w, d), {}))
                  for d in widths], "peak lr (train.lr)")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("final val loss (nats per byte token)")
    axes[1].legend(title="size (star: best lr)")
    fig.suptitle("configs/scaling/lr_transfer.py: the best lr per size, without and with "
                 "train.lr_base_width", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# Depths: one multiplier on every rate, each depth's rates by config/depth.py
# (configs/scaling/depth_lr_transfer.py).

def depth_losses(workdir):
    """({depth: {multiplier: final val loss}}, {depth: (d_model, steps, tokens a step)}, unit)
    of the finished members: nats per byte (val_bpb × ln 2) where every member has val_bpb,
    else val_loss in nats per token."""
    rows = [(DEPTH_NAME.match(r["name"]), r) for r in collect(workdir)]
    rows = [(m, r) for m, r in rows if m]
    per_byte = all(math.isfinite(r["val_bpb"]) for _, r in rows)
    data, shapes = {}, {}
    for m, r in rows:
        depth = int(m.group(2))
        loss = r["val_bpb"] * math.log(2) if per_byte else r["val_loss"]
        data.setdefault(depth, {})[float(m.group(1))] = loss
        shapes[depth] = (r["d_model"], r["steps"], r["tokens"] // r["steps"])
    unit = "nats per byte" if per_byte else "nats per token"
    return {d: data[d] for d in sorted(data)}, shapes, unit


def depth_table(data, shapes) -> str:
    """A row per depth (its derived width and steps), a column per multiplier, the best in
    bold; then the worst excess over the depths' own bests at each multiplier."""
    xs = sorted({x for curve in data.values() for x in curve})
    lines = ["| depth | d_model | steps × tokens a step | " + " | ".join(f"x{x:g}" for x in xs) +
             " | best |", "|---|---|---|" + "---|" * (len(xs) + 1)]
    for depth, curve in data.items():
        d, steps, per_step = shapes[depth]
        lines.append(f"| {depth} | {d} | {steps:,} × {per_step:,} | " +
                     " | ".join(cells(curve, xs)) + f" | x{best(curve):g} |")
    lines.append("| every depth at one multiplier: worst excess over its best | | | " +
                 " | ".join(worst_excess(list(data.values()), xs)) + " | |")
    return "\n".join(lines)


def depth_figure(data, shapes, unit, out) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    draw(ax, [(f"depth {depth} (d_model {shapes[depth][0]})", curve)
              for depth, curve in data.items()], "multiplier on both rates (muon_lr, lr)")
    ax.set_ylabel(f"final val loss ({unit})")
    ax.legend(title="depth (star: best)")
    ax.set_title("configs/scaling/depth_lr_transfer.py: the best multiplier per depth,\n"
                 "each depth's rates, batch and decay by config/depth.py", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m transformer.lab.lr_transfer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", action="store_true", help="a depth sweep "
                        "(configs/scaling/depth_lr_transfer.py), not a width one")
    parser.add_argument("workdir", type=Path, help="the sweep's --workdir")
    parser.add_argument("out", type=Path, help="the figure to write (.png)")
    args = parser.parse_args(argv)
    if args.depth:
        data, shapes, unit = depth_losses(args.workdir)
        depth_figure(data, shapes, unit, args.out)
        print(depth_table(data, shapes))
        print(f"\n(final val loss in {unit})")
        return
    data, widths, rule = losses(args.workdir)
    figure(data, widths, rule, args.out)
    print(table(data, widths, rule))
    print()
    print(one_lr(data, widths, rule))


if __name__ == "__main__":
    main()

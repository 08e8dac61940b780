"""The lr-transfer figure and table of docs/scaling.md, from a finished (or partial) sweep of
configs/scaling/lr_transfer.py:

    python -m transformer scaling --sweep=configs/scaling/lr_transfer.py --workdir=runs/lr_transfer
    python -m transformer.tools.lr_transfer runs/lr_transfer docs/lr_transfer.png    # prints the table

Final val loss against the peak lr, one curve per size, left without the width rule
(train.lr_base_width=0), right with it (16: the smallest width). At the base width the rule's
multiplier is 1.0, so a size-16 member is the same run under both (bitwise,
tests/test_width_lr.py): where the sweep skipped one, the right panel uses its twin.
"""

import json
import math
import re
import sys
from pathlib import Path

from transformer.scaling.plot import _pyplot
from transformer.scaling.report import collect

NAME = re.compile(r"lr_base_width=(\d+)_lr=([0-9.e+-]+)_L\d+-d(\d+)_")


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


def table(data, widths, rule) -> str:
    lrs = sorted({lr for curve in data.values() for lr in curve})
    lines = ["| rule | d_model | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
             "|---|---|" + "---|" * (len(lrs) + 1)]
    for w in (0, rule):
        for d in widths:
            curve = data.get((w, d), {})
            best = min(curve, key=curve.get) if curve else math.nan
            cells = [(f"**{curve[lr]:.4f}**" if lr == best else f"{curve[lr]:.4f}")
                     if lr in curve else "-" for lr in lrs]
            label = "off" if w == 0 else f"lr_base_width={w}"
            lines.append(f"| {label} | {d} | " + " | ".join(cells) + f" | {best:g} |")
    return "\n".join(lines)


def one_lr(data, widths, rule) -> str:
    """What a ladder pays for training every size at one lr: for each lr and rule, the worst
    excess of a size's loss over that size's best (over the lrs tried)."""
    lrs = sorted({lr for curve in data.values() for lr in curve})
    lines = ["| rule | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
             "|---|" + "---|" * len(lrs)]
    for w in (0, rule):
        curves = [data.get((w, d), {}) for d in widths]
        cells = []
        for lr in lrs:
            if all(lr in c for c in curves):
                cells.append(f"{max(c[lr] - min(c.values()) for c in curves):+.4f}")
            else:
                cells.append("-")
        label = "off" if w == 0 else f"lr_base_width={w}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(data, widths, rule, out) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colours = plt.cm.viridis([i / max(len(widths) - 1, 1) * 0.85 for i in range(len(widths))])
    for ax, w, title in ((axes[0], 0, "without the rule: every matrix at lr"),
                         (axes[1], rule, f"with the rule: hidden matrices at lr·{rule}/d_model")):
        for d, colour in zip(widths, colours):
            curve = data.get((w, d), {})
            if not curve:
                continue
            lrs = sorted(curve)
            ax.plot(lrs, [curve[lr] for lr in lrs], "o-", color=colour, label=f"d_model {d} ({d // 16} layer{'s' * (d > 16)})")
            best = min(curve, key=curve.get)
            ax.plot([best], [curve[best]], "*", color=colour, markersize=16,
                    markeredgecolor="black")
        ax.set_xscale("log", base=2)
        ticks = sorted({lr for curve in data.values() for lr in curve})
        ax.set_xticks(ticks, [f"{lr:g}" for lr in ticks], rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("peak lr (train.lr)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final val loss (nats per byte token)")
    axes[1].legend(title="size (star: best lr)")
    fig.suptitle("configs/scaling/lr_transfer.py: the best lr per size, without and with "
                 "train.lr_base_width", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(workdir, out):
    data, widths, rule = losses(workdir)
    figure(data, widths, rule, out)
    print(table(data, widths, rule))
    print()
    print(one_lr(data, widths, rule))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""IsoFLOP curves for the quick start's recipe (its block and Muon, configs/default.py) at 4
layers, widths 12..192, over 5 budgets spanning 100x (2e11..2e13 FLOPs; the quick start is one
9e12-FLOP run of the width-128 member). A budget trains only the sizes whose tokens per
non-embedding parameter fall in WINDOW, those around its optimum: 29 runs, ~50 min on 2 cores.

    python -m transformer scaling --sweep=configs/scaling/cpu_isoflop.py --workdir=runs/isoflop
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop --verify --flops=4e13 --seeds=1

GPT-2's block (AdamW) is the variant to compare against: configs/scaling/cpu_isoflop_gpt2.py.
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import sweep_config

N_LAYERS = 4
WIDTHS = (12, 16, 24, 32, 48, 64, 96, 128, 192)
BUDGETS = (2e11, 6e11, 2e12, 6e12, 2e13)
WINDOW = (1.5, 1500)  # tokens per non-embedding parameter a member may train on


def sizes(n_layers=N_LAYERS, widths=WIDTHS, head_dim=32, ff_ratio=2):
    """The quick start's shape at other widths: heads of up to 32 (its 128 / 4), d_ff twice
    d_model (its SwiGLU's 256 at 128)."""
    out = []
    for d in widths:
        heads = -(-d // head_dim)
        out.append(dict(name=f"L{n_layers}-d{d}", n_layers=n_layers, d_model=d, n_heads=heads,
                        d_ff=ff_ratio * d))
    return out


def get_config():
    base = quick_start()
    # The recipe its records were measured on: the quick start before row 24 of docs/speedrun.md
    # (value embeddings, 835 steps) joined it; a sweep with them is another study.
    base.model.update(value_embeds="none")
    base.train.update(steps=880)
    # The whole standard library (~32 MB, ~10M tokens): the largest budget's smallest member
    # reads ~3 epochs of it, the quick start's 4 MB would be ~20.
    base.data.update(max_bytes=32_000_000)
    # Short members (80 steps at the smallest budget) get a 20-step warm-up, not 50; no
    # evaluation while training (the report reads the final one), few checkpoints.
    base.train.update(warmup_steps=20, eval_every=1_000_000, ckpt_every=2000, log_every=100)
    return sweep_config(base, sizes(), budget_kind="flops", budgets=BUDGETS, window=WINDOW)

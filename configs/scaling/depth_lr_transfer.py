"""Do the depth rules (config/depth.py) transfer the learning rate? 5 multipliers 2x apart on
both of the quick start's rates at depths 2, 3, 4: where they transfer, every depth is best at 1.

    python -m transformer scaling --sweep=configs/scaling/depth_lr_transfer.py \\
        --workdir=runs/depth_lr_transfer --no_progress
    python -m transformer.lab.lr_transfer --depth runs/depth_lr_transfer \\
        docs/depth_lr_transfer.png

15 runs at 4 tokens per non-embedding parameter (265-1,026 steps): 34 min on 2 loaded cores,
~15 idle. Depths 2-4 span 8x in matrix parameters; depth 6 costs ~10x depth 4: add it to DEPTHS.
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import depths, sweep_config

DEPTHS = (2, 3, 4)
MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
TOKENS_PER_PARAM = 4


def get_config():
    base = quick_start()
    # The recipe its records were measured on: the quick start before row 24 of docs/speedrun.md
    # (value embeddings, 835 steps) joined it; a sweep with them is another study.
    base.model.update(value_embeds="none")
    base.train.update(steps=880)
    base.train.update(eval_every=1_000_000, ckpt_every=1000)
    lr, muon_lr = base.train.lr, base.train.muon_lr
    variants = [{"name": f"lrx{m:g}", "group": "depth rules", "train.lr": lr * m,
                 "train.muon_lr": muon_lr * m} for m in MULTIPLIERS]
    return sweep_config(base, depths(DEPTHS), budget_kind="chinchilla",
                        budgets=[TOKENS_PER_PARAM], variants=variants)

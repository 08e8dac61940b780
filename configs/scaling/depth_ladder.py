"""The depth ladder: the quick start's block and optimizer (configs/default.py) at depths 2..6,
members that differ only by model.depth. Use it for a scaling study of the default recipe.

    python -m transformer scaling --sweep=configs/scaling/depth_ladder.py --workdir=runs/depth
    python -m transformer sizes --config=configs/default.py --config.model.depth=6   # a member

Each depth derives sizes, rates, batch and decay from the quick start (depth 4) by the rules in
transformer/config/depth.py; the budget is 12 tokens per non-embedding parameter (0.8M tokens
at depth 2 to 21M at depth 6): hours on 2 CPU cores.
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import depths, sweep_config

DEPTHS = (2, 3, 4, 5, 6)
TOKENS_PER_PARAM = 12


def get_config():
    base = quick_start()
    # The recipe its records were measured on: the quick start before row 24 of docs/speedrun.md
    # (value embeddings, 835 steps) joined it; a sweep with them is another study.
    base.model.update(value_embeds="none")
    base.train.update(steps=880)
    base.train.update(eval_every=1000, ckpt_every=1000)
    return sweep_config(base, depths(DEPTHS), budget_kind="chinchilla",
                        budgets=[TOKENS_PER_PARAM])

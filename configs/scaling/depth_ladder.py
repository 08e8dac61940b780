"""The depth ladder: the quick start's block and optimizer (configs/default.py: RoPE, RMSNorm,
SwiGLU, untied head, Muon) at depths 2..6, members that differ only by model.depth.

    python -m transformer scaling --sweep=configs/scaling/depth_ladder.py --workdir=runs/depth
    python -m transformer sizes --config=configs/default.py --config.model.depth=6   # a member

Each depth derives its sizes, learning rates, batch and weight decay from the quick start (the
reference, depth 4) by config/depth.py's written rules: d_model = 32 × depth in heads of 32,
d_ff = 2 × d_model, Muon's rate × √(B/B₀), AdamW's × √(B/B₀) · √(128/d_model), the batch
B₀ · 2^round(log2((D/D₀)^0.383)) and the decay λ₀ · √(B/B₀) · D₀/D. The budget is the rules'
horizon at nanochat's ratio, 12 tokens per non-embedding parameter (the sweep's steps; the
rules' own train.tokens_per_param gives the same to ~1%, the norms' parameters):
0.8M tokens at depth 2 to 21M at depth 6 (~5,200 steps of 4,096 tokens), hours on 2 CPU
cores. Not run yet.
"""

import importlib.util
from pathlib import Path

from transformer.scaling.sweep import depths, sweep_config

DEPTHS = (2, 3, 4, 5, 6)
TOKENS_PER_PARAM = 12


def quick_start():
    """configs/default.py's config, loaded by its path (configs/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "default.py"
    spec = importlib.util.spec_from_file_location("quick_start_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config():
    base = quick_start()
    base.train.update(eval_every=1000, ckpt_every=1000)
    return sweep_config(base, depths(DEPTHS), budget_kind="chinchilla",
                        budgets=[TOKENS_PER_PARAM])

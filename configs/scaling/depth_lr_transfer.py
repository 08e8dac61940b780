"""Do the depth rules transfer the learning rate? One multiplier (5 values 2x apart) on both
of the quick start's rates at depths 2, 3 and 4, each depth's rates, batch and decay derived by
transformer/config/depth.py. Under rules that transfer, every depth's best multiplier is the
same (1, where the quick start was tuned).

    python -m transformer scaling --sweep=configs/scaling/depth_lr_transfer.py \\
        --workdir=runs/depth_lr_transfer --no_progress
    python -m transformer.tools.lr_transfer --depth runs/depth_lr_transfer \\
        docs/depth_lr_transfer.png                                     # the figure and table

4 tokens per non-embedding parameter (the budget counts the norms too, so about 1% more than
`sizes --config.model.depth=N --config.train.tokens_per_param=4` prints): depth 2 is 265 steps
of 8 x 128 tokens, depth 3 438 steps of 16 x 128, depth 4 1,026 steps of 16 x 128 (the quick
start's size); 15 runs, about 11 CPU-minutes on 2 idle cores. Depths 2-4 span 8x in matrix
parameters (67K to 520K). Depth 6 costs about 10x depth 4 (3.4x the matrix parameters, so
3.4x the tokens, each dearer): add it to DEPTHS where there are CPU hours to spend.
"""

import importlib.util
from pathlib import Path

from transformer.scaling.sweep import depths, sweep_config

DEPTHS = (2, 3, 4)
MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
TOKENS_PER_PARAM = 4


def _ladder():
    path = Path(__file__).resolve().parent / "depth_ladder.py"
    spec = importlib.util.spec_from_file_location("depth_ladder_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config():
    base = _ladder().quick_start()
    base.train.update(eval_every=1_000_000, ckpt_every=1000)
    lr, muon_lr = base.train.lr, base.train.muon_lr
    variants = [{"name": f"lrx{m:g}", "group": "depth rules", "train.lr": lr * m,
                 "train.muon_lr": muon_lr * m} for m in MULTIPLIERS]
    return sweep_config(base, depths(DEPTHS), budget_kind="chinchilla",
                        budgets=[TOKENS_PER_PARAM], variants=variants)

"""Do the depth rules transfer the learning rate? One multiplier on both of the quick start's
rates (Muon's 0.01, AdamW's 1.5e-2), 5 values 2× apart, at depths 2, 4 and 6 (d_model 64,
128, 192), each depth's rates, batch and decay then derived by config/depth.py's rules. Under
rules that transfer, every depth's best multiplier is the same (1, where the quick start was
tuned).

    python -m transformer scaling --sweep=configs/scaling/depth_lr_transfer.py \\
        --workdir=runs/depth_lr_transfer

A horizon of 4 tokens per non-embedding parameter (not the ladder's 12, to keep 15 runs to a
few CPU hours: 0.27M, 2.1M and 7.1M tokens): the rules' batch and decay follow D/D₀ = N/N₀
whatever the ratio. The report keeps each depth's best multiplier (one group). Not run yet.
"""

import importlib.util
from pathlib import Path

from transformer.scaling.sweep import depths, sweep_config

DEPTHS = (2, 4, 6)
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

"""Does the learning rate transfer across sizes? 10 learning rates at 3 sizes of the tiny
ladder's rule (d_model 16, 32, 64), with the width rule off and on (train.lr_base_width).
Use it to check the width rule before trusting one lr for a ladder; the second command
draws the figure and prints the table of docs/scaling.md.

    python -m transformer scaling --sweep=configs/scaling/lr_transfer.py --workdir=runs/lr_transfer
    python -m transformer.lab.lr_transfer runs/lr_transfer docs/lr_transfer.png
"""

from transformer.config import base_config
from transformer.scaling.sweep import grid, ladder, sweep_config

# 2x apart over 128x, plus two √2-steps (0.0226, 0.0453) where the rule's optima fell.
LRS = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 2.26e-2, 3.2e-2, 4.53e-2, 6.4e-2, 1.28e-1]


def get_config():
    base = base_config()
    base.model.update(max_seq_len=64)
    base.sample.max_new_tokens = 40
    base.data.update(max_bytes=1_000_000)
    base.train.update(batch_size=8, warmup_steps=20, log_every=50, eval_every=1_000_000,
                      eval_batches=16, ckpt_every=1_000_000)
    variants = grid({"train.lr_base_width": [0, 16], "train.lr": LRS})
    return sweep_config(base, ladder([1, 2, 4], aspect=16, head_dim=16),
                        budget_kind="tokens", budgets=[200_000], variants=variants)

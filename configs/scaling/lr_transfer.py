"""Does the learning rate transfer across sizes? An lr sweep at 3 sizes of the tiny ladder's
rule, with the width rule off and on (train.lr_base_width, transformer/train/width_lr.py).

    python -m transformer scaling --sweep=configs/scaling/lr_transfer.py --workdir=runs/lr_transfer
    python -m transformer.tools.lr_transfer runs/lr_transfer docs/lr_transfer.png

Sizes: the tiny ladder's rule (d_model = 16 × n_layers, heads of 16, d_ff = 4 × d_model) at
n_layers 1, 2, 4: d_model 16, 32, 64 (4× in width). Byte-level, context 64, batch 8 (512
tokens a step), 200K tokens each, cosine schedule with 20 warm-up steps, one evaluation at
the end over 16 held-out batches. Grid: lr_base_width 0 (off) and 16 (the smallest width:
its members are the same runs under both, bit for bit) × 10 learning rates (LRS); the
report keeps each size's best lr per rule. 60 runs (docs/scaling.md ran all but the 9
rule-on twins at d_model 16). Results and the reading: docs/scaling.md.
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

"""A sweep in a few minutes, for trying the scaling commands: 5 sizes (d_model = 16 x
n_layers, n_layers 1..5) x 2 token budgets (100K, 200K), byte-level, context 64. Too small
for a trustworthy fit: use it to see what a sweep writes (docs/scaling.md). Its lr, 3.2e-2
with the width rule at lr_base_width=16, is the best of configs/scaling/lr_transfer.py's sweep.

    python -m transformer scaling --sweep=configs/scaling/tiny_ladder.py --workdir=runs/tiny_ladder
"""

from transformer.config import base_config
from transformer.scaling.sweep import ladder, sweep_config


def get_config():
    base = base_config()
    base.model.update(max_seq_len=64)
    base.sample.max_new_tokens = 40
    base.data.update(max_bytes=1_000_000)
    base.train.update(batch_size=8, lr=3.2e-2, warmup_steps=20, log_every=10, eval_every=100,
                      eval_batches=4, ckpt_every=200, lr_base_width=16)
    return sweep_config(base, ladder(range(1, 6), aspect=16, head_dim=16),
                        budget_kind="tokens", budgets=[100_000, 200_000])

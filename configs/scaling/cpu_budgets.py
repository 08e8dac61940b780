"""Sizes × data on CPU: 3 sizes of the CPU ladder at 3 token budgets, for an L(N, D) fit.

    python -m transformer scaling --sweep=configs/scaling/cpu_budgets.py --workdir=runs/budgets

Same rule and training settings as cpu_ladder.py (d_model = 32 × n_layers, heads of 32,
the width rule at lr_base_width=96),
n_layers 1..3 at 0.25M, 0.5M and 1M tokens: 9 runs, about 10 minutes on 2 idle cores.
"""

from transformer.config import base_config
from transformer.scaling.sweep import ladder, sweep_config


def get_config():
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=128)
    base.sample.max_new_tokens = 100
    base.data.update(tokenizer="bpe", bpe_vocab_size=1024, max_bytes=4_000_000)
    base.train.update(batch_size=16, lr=2e-3, warmup_steps=50, log_every=50, eval_every=250,
                      eval_batches=8, ckpt_every=250, lr_base_width=96)
    return sweep_config(base, ladder(range(1, 4), aspect=32, head_dim=32),
                        budget_kind="tokens", budgets=[250_000, 500_000, 1_000_000])

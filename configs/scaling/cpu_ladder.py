"""The CPU ladder: 5 sizes, 12.8K → 1.55M non-embedding params (121×), 1.5M tokens each.

    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder

Sizing rule (transformer.scaling.ladder): d_model = 32 × n_layers, heads of 32 (so
n_heads = n_layers), d_ff = 4 × d_model, n_layers = 1..5. Every run: byte-level BPE with 1024
tokens learned on the standard-library corpus, context 128, batch 16 (2,048 tokens a step),
732 steps = 1.5M tokens, the same learning-rate schedule. The width rule is on
(train.lr_base_width=96, transformer/train/width_lr.py): lr 2e-3 is the rate of the middle
member, L3-d96, and the hidden matrices of the others step at 2e-3 × 96 / d_model (6e-3 at
d32, 1.2e-3 at d160), so every size sits near the same distance from its optimum
(docs/scaling.md, "Learning rates across sizes"). About 10-15 minutes on 2 idle
CPU cores, most of it in the largest model.
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
    return sweep_config(base, ladder(range(1, 6), aspect=32, head_dim=32),
                        budget_kind="tokens", budgets=[1_500_000])

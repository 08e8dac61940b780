"""A sweep in a few minutes, for trying the scaling commands: 5 sizes x 2 token budgets.

    python -m transformer scaling --sweep=configs/scaling/tiny_ladder.py --workdir=runs/tiny_ladder

Sizing rule (transformer.scaling.ladder): d_model = 16 x n_layers, heads of 16, d_ff = 4 x
d_model, n_layers = 1..5 (3.3K to 389K non-embedding params). Byte-level, context 64,
batch 8 (512 tokens a step), 100K and 200K tokens per member. The members are too small and
too short for a trustworthy fit: this config is for seeing what a sweep writes
(docs/scaling.md), the CPU ladder and IsoFLOP configs are for results.

Learning rate: the width rule at lr_base_width=16 and lr 3.2e-2, the lr that came within 0.013
nats of every size's best in the lr sweep of configs/scaling/lr_transfer.py (the same data,
context, batch and 200K tokens at d_model 16, 32, 64; docs/scaling.md). The earlier 3e-3 for
every size lies between that sweep's 2e-3 and 4e-3, where each size was 0.06 to 0.40 nats
above its best.
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

"""The CPU ladder: 5 sizes (d_model = 32 x n_layers, n_layers 1..5; 12.8K to 1.55M
non-embedding params), 1.5M tokens each, byte-level BPE of 1024 tokens, the width rule on
(train.lr_base_width=96) so one learning rate serves every size. Use it for a loss-against-
size curve on a CPU in about 10-15 minutes (docs/scaling.md).

    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder
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

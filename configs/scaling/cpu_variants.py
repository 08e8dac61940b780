"""Scaling of a change: GPT-2's block (`gpt2`) against the modern one (`modern`: RoPE,
RMSNorm, SwiGLU) at every size of the CPU ladder (cpu_ladder.py), 10 runs. Use it to see
whether a change's advantage grows or shrinks with size: the report fits L(N) per variant
and tables the gap size by size (docs/scaling.md).

    python -m transformer scaling --sweep=configs/scaling/cpu_variants.py --workdir=runs/variants
"""

from transformer.config import base_config
from transformer.scaling.sweep import ladder, sweep_config


def get_config():
    base = base_config()  # the same base as cpu_ladder.py
    base.model.update(vocab_size=0, max_seq_len=128)
    base.sample.max_new_tokens = 100
    base.data.update(tokenizer="bpe", bpe_vocab_size=1024, max_bytes=4_000_000)
    base.train.update(batch_size=16, lr=2e-3, warmup_steps=50, log_every=50, eval_every=250,
                      eval_batches=8, ckpt_every=250, lr_base_width=96)
    variants = [{"name": "gpt2"},
                {"name": "modern", "model.position": "rope", "model.norm": "rmsnorm",
                 "model.mlp": "swiglu"}]
    return sweep_config(base, ladder(range(1, 6), aspect=32, head_dim=32),
                        budget_kind="tokens", budgets=[1_500_000], variants=variants)

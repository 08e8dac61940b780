"""Scaling of a change: GPT-2's block against the modern combination across the CPU ladder.

    python -m transformer scaling --sweep=configs/scaling/cpu_variants.py --workdir=runs/variants

Two variants, each trained at every size of the CPU ladder (cpu_ladder.py: d_model =
32 × n_layers, n_layers 1..5, 1.5M tokens each, the width rule at lr_base_width=96):
`gpt2` (learned positions, LayerNorm, GELU MLP: the defaults) and `modern` (RoPE, RMSNorm,
SwiGLU). The report fits L(N) per variant and draws both on loss_vs_params.png: whether
the modern block's advantage grows or shrinks with size is the gap between the two curves
(the report's gap table: size by size, paired). 10 runs, 37 minutes measured on 2 shared
cores under contention (load average 5-9); idle not measured. Results (measured before the
width rule: add --sweep.base.train.lr_base_width=0 to reproduce them): docs/scaling.md.
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

"""IsoFLOP curves on CPU (Hoffmann et al. 2022, approaches 2 and 3): 8 widths at each of 3
compute budgets, 2e11, 6e11 and 2e12 FLOPs; every size gets tokens = budget / (its training
FLOPs per token), so at each budget small models see many tokens and large ones few.

    python -m transformer scaling --sweep=configs/scaling/cpu_isoflop.py --workdir=runs/isoflop
    python -m transformer scaling --workdir=runs/isoflop --report
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=6e12
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest

Sizes: 2 layers, d_model 8, 12, 16, 24, 32, 48, 64, 96 (about 1.5x apart in width, 2.2x
in non-embedding params: 1.76K → 224K), heads of at most 16 dims, d_ff = 4 × d_model. A fixed
depth lets width alone set N, so the ladder is fine enough to put each budget's minimum
between its ends. A first version (n_layers 1..5 of the aspect-16 rule at 3e11..3e12) had
its smallest size best at 3e11 and no valley anywhere; its runs at 1e12 put the optimum
near 25K non-embedding params, so these budgets and sizes bracket that.

Note: with a 1024-token vocabulary the tied output head (6·V·d FLOPs per token) costs more
than the blocks for d <= 32, so C is not 6·N·D here; N in the fits is non-embedding params,
D tokens, and C the counted training FLOPs (head and attention included).

Byte-level BPE with 1024 tokens, context 128, batch 8 (1,024 tokens a step: the largest
model still gets ~95 steps at the smallest budget), cosine schedule with 20 warmup steps,
one evaluation at the end over 32 held-out batches. The width rule is on
(train.lr_base_width=32, transformer/train/width_lr.py): lr 2e-3 is the rate at d_model 32,
the hidden matrices of the others step at 2e-3 × 32 / d_model (8e-3 at d8, 6.7e-4 at d96).
24 runs, 2.2e13 FLOPs in all: 13.5 minutes with its report on 2 idle Zen 4 cores (measured
before the width rule, docs/scaling.md); the smallest widths are bound by per-step
overhead, not FLOPs.
"""

from transformer.config import base_config
from transformer.scaling.sweep import sweep_config

WIDTHS = (8, 12, 16, 24, 32, 48, 64, 96)


def sizes(n_layers=2, widths=WIDTHS, max_head_dim=16, mlp_ratio=4):
    out = []
    for d in widths:
        heads = -(-d // max_head_dim)
        out.append(dict(name=f"L{n_layers}-d{d}", n_layers=n_layers, d_model=d,
                        n_heads=heads, d_ff=mlp_ratio * d))
    return out


def get_config():
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=128)
    base.sample.max_new_tokens = 60
    base.data.update(tokenizer="bpe", bpe_vocab_size=1024, max_bytes=4_000_000)
    base.train.update(batch_size=8, lr=2e-3, warmup_steps=20, log_every=50,
                      eval_every=1_000_000, eval_batches=32, ckpt_every=1000,
                      lr_base_width=32)
    return sweep_config(base, sizes(), budget_kind="flops", budgets=[2e11, 6e11, 2e12])

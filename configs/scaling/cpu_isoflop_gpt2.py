"""The IsoFLOP sweep on GPT-2's block (learned positions, LayerNorm, GELU, AdamW): the
variant to hold configs/scaling/cpu_isoflop.py (the quick start's block and Muon) against.
8 widths (2 layers, d_model 8..96) at each of 3 compute budgets, 2e11, 6e11 and 2e12 FLOPs,
each size trained on budget / (its FLOPs per token) tokens: 24 runs, about a quarter of an hour
on a CPU (docs/scaling.md has the reading and the fit).

    python -m transformer scaling --sweep=configs/scaling/cpu_isoflop_gpt2.py --workdir=runs/gpt2iso
    python -m transformer scaling --workdir=runs/gpt2iso --report --holdout=largest
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

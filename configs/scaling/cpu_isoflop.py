"""IsoFLOP curves on CPU (Hoffmann et al. 2022, approaches 2 and 3): 5 sizes at each of 3
compute budgets, 3e11, 1e12 and 3e12 FLOPs; every size gets tokens = budget / (its training
FLOPs per token), so at each budget small models see many tokens and large ones few.

    python -m transformer.scaling --sweep=configs/scaling/cpu_isoflop.py --workdir=runs/isoflop
    python -m transformer.scaling --workdir=runs/isoflop --report
    python -m transformer.scaling --workdir=runs/isoflop --predict --flops=1e13
    python -m transformer.scaling --workdir=runs/isoflop --report --holdout=largest

Sizing rule (transformer.scaling.ladder): d_model = 16 × n_layers, heads of 16, d_ff =
4 × d_model, n_layers = 1..5: 3.3K → 389K non-embedding params. A first run with
n_layers = 2..6 found the smallest size best at 3e11 (no valley), so the ladder starts lower. Byte-level BPE with 1024 tokens,
context 128, batch 8 (1,024 tokens a step: the largest model still gets ~60 steps at the
smallest budget), cosine schedule with 20 warmup steps, one evaluation at the end over
32 held-out batches. 15 runs, 2.2e13 FLOPs in all: about 20 minutes on 2 idle cores.
"""

from transformer.config import base_config
from transformer.scaling import ladder, sweep_config


def get_config():
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=128)
    base.sample.max_new_tokens = 60
    base.data.update(tokenizer="bpe", bpe_vocab_size=1024, max_bytes=4_000_000)
    base.train.update(batch_size=8, lr=2e-3, warmup_steps=20, log_every=50,
                      eval_every=1_000_000, eval_batches=32, ckpt_every=1000)
    return sweep_config(base, ladder(range(1, 6), aspect=16, head_dim=16),
                        budget_kind="flops", budgets=[3e11, 1e12, 3e12])

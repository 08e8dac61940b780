"""The GPU ladder: 7 sizes, 10.6M → 1.08B non-embedding params, Chinchilla budget.

    python -m transformer scaling --sweep=configs/scaling/gpu_ladder.py --workdir=runs/gpu_ladder
    python -m transformer scaling --sweep=configs/scaling/gpu_ladder.py --workdir=runs/gpu_ladder --index=3

Sizing rule (transformer.scaling.ladder): d_model = 64 × n_layers, heads of 64 (n_heads =
n_layers), d_ff = 4 × d_model, n_layers in 6, 8, 12, 16, 20, 24, 28. Each run sees 20 tokens
per non-embedding parameter (Hoffmann et al. 2022): 0.2B tokens for the smallest, 22B for
the largest. GPT-2-sized BPE (32K tokens), context 1024, bfloat16 compute, scanned layers.
data.corpus names a prepared folder (CORPUS below; make it once with
`python -m transformer prepare`, docs/data.md); another one with --sweep.base.data.corpus=DIR.
The width rule is on (train.lr_base_width=768, transformer/train/width_lr.py): lr 6e-4 is
GPT-3 Small's at d_model 768 (Brown et al. 2020, Table 2.1), and the hidden matrices of the
other sizes step at 6e-4 × 768 / d_model (1.2e-3 at d384, 2.6e-4 at d1792).
FineWeb's 10B-token sample is read about 2.2 times by the largest member (22B tokens): its
start-up summary says how many epochs it makes.
"""

from transformer.config import base_config
from transformer.scaling.sweep import ladder, sweep_config

# Made once, before the sweep (about 20 GB for FineWeb's 10B-token sample; docs/data.md):
#   python -m transformer prepare 'fineweb/sample/10BT/*.parquet' --out=data/fineweb10B \
#       --tokenizer=bpe --vocab_size=32768
CORPUS = "data/fineweb10B"


def get_config():
    base = base_config()
    base.model.update(vocab_size=0, max_seq_len=1024, dtype="bfloat16", scan_layers=True,
                      remat="dots")
    # A prepared folder (docs/data.md): its shards are read window by window, its tokenizer
    # is the run's; every member reads the same folder, none tokenizes anything.
    base.data.update(corpus=CORPUS, tokenizer="bpe", bpe_vocab_size=32768)
    base.train.update(batch_size=256, lr=6e-4, warmup_steps=500, log_every=100,
                      eval_every=1000, eval_batches=20, ckpt_every=1000, lr_base_width=768)
    return sweep_config(base, ladder([6, 8, 12, 16, 20, 24, 28], aspect=64, head_dim=64),
                        budget_kind="chinchilla", budgets=[20])

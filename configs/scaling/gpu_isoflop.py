"""IsoFLOP curves on GPU (Hoffmann et al. 2022, approach 2): the 5 smaller sizes of the GPU
ladder (7.1M → 262M) at 1e17, 3e17 and 1e18 FLOPs; every size gets tokens = budget / (its
training FLOPs per token).

    python -m transformer scaling --sweep=configs/scaling/gpu_isoflop.py --workdir=runs/isoflop

15 runs; the report fits L(N, D) over all of them. Same rule, the same prepared folder
(data.corpus) and the same block and optimizer (the quick start's) as gpu_ladder.py.
"""

from transformer.config.files import quick_start
from transformer.scaling.sweep import ladder, sweep_config

# Made once, before the sweep (about 20 GB for FineWeb's 10B-token sample; docs/data.md):
#   python -m transformer prepare 'fineweb/sample/10BT/*.parquet' --out=data/fineweb10B \
#       --tokenizer=bpe --vocab_size=32768
CORPUS = "data/fineweb10B"


def get_config():
    # The quick start's block and optimizer (configs/default.py: RoPE, RMSNorm, SwiGLU with
    # d_ff = 2 d_model, untied head, Muon for the blocks' matrices, AdamW for the rest, its
    # rates), at GPU sizes. Muon's orthogonalised steps keep its rate across widths; the
    # AdamW groups (embeddings, head, norms) take the depth dial's 1/sqrt(width) rule
    # (config/depth.py, rule 4) at the ladder's middle width, 768: 1.5e-2 x sqrt(128/768).
    base = quick_start()
    base.model.update(vocab_size=0, max_seq_len=1024, dtype="bfloat16", scan_layers=True,
                      value_embeds="none",  # per block: a scanned body cannot hold them
                      remat="dots")
    # A prepared folder (docs/data.md): its shards are read window by window, its tokenizer
    # is the run's; every member reads the same folder, none tokenizes anything.
    base.data.update(corpus=CORPUS, tokenizer="bpe", bpe_vocab_size=32768)
    base.train.update(batch_size=256, lr=6e-3, warmup_steps=500, log_every=100,
                      eval_every=1000, eval_batches=20, ckpt_every=1000)
    return sweep_config(base, ladder([6, 8, 12, 16, 20], aspect=64, head_dim=64,
                                     mlp_ratio=2), budget_kind="flops", budgets=[1e17, 3e17, 1e18])

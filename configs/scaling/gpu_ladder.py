"""The GPU ladder: 7 sizes (d_model = 64 x n_layers, n_layers 6..28; 7.1M to 720M
non-embedding params), 20 tokens per parameter (Chinchilla), 32K BPE, context 1024, bf16,
scanned layers, the quick start's block and optimizer. Use it on GPUs with a prepared corpus
(CORPUS below, or --sweep.base.data.corpus=DIR; docs/data.md); --index runs one member.

    python -m transformer scaling --sweep=configs/scaling/gpu_ladder.py --workdir=runs/gpu_ladder
    python -m transformer scaling --sweep=configs/scaling/gpu_ladder.py --workdir=runs/gpu_ladder --index=3
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
    sizes = ladder([6, 8, 12, 16, 20, 24, 28], aspect=64, head_dim=64, mlp_ratio=2)
    return sweep_config(base, sizes, budget_kind="chinchilla", budgets=[20])

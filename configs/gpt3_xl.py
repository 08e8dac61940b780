"""GPT-3 XL, the paper's ~1.3B model (Brown et al. 2020, Table 2.1): 24 layers, d_model 2048,
16 heads of 128, context 2048, batch 1M tokens, the GPT-2 BPE vocabulary of 50257. A size for
one accelerator host, not for this CPU; to see whether and how it fits a chip:

    python -m transformer sizes --config=configs/gpt3_xl.py
    python -m transformer compile --config=configs/gpt3_xl.py --target=v5e:4x4
"""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(vocab_size=50257, d_model=2048, n_layers=24, n_heads=16, d_ff=4 * 2048,
                   max_seq_len=2048, tie_embeddings=True, dtype="bfloat16", scan_layers=True,
                   remat="block")
    c.data.tokenizer = "bpe"
    c.data.bpe_vocab_size = 50257
    c.train.update(batch_size=512, lr=2e-4)  # 1M tokens per batch, as in the paper
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    return c

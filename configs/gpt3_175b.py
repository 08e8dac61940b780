"""GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads of 128,
context 2048, the GPT-2 BPE vocabulary of 50257, tied input/output embeddings.
Far too big to train here; for sizes and FLOPs:

    python -m transformer sizes --config=configs/gpt3_175b.py      # ~174.6B parameters
"""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(vocab_size=50257, d_model=12288, n_layers=96, n_heads=96, d_ff=4 * 12288,
                   max_seq_len=2048, tie_embeddings=True, dtype="bfloat16", scan_layers=True,
                   remat="block")
    c.data.tokenizer = "bpe"
    c.data.bpe_vocab_size = 50257
    c.train.update(batch_size=1536, lr=6e-5)  # 3.2M tokens per batch, as in the paper
    c.sample.max_new_tokens = 200
    return c

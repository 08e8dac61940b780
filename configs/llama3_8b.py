"""A Llama-3-8B-class model (Meta 2024): 32 layers, d_model 4096, 32 query heads and 8 K/V
heads of 128, SwiGLU hidden width 14336, RoPE, RMSNorm, no biases, an untied head, a
128,256-token vocabulary, context 8192. The shape only (no Llama weights or tokenizer): for
sizes, FLOPs and whether a TPU or GPU topology fits it:

    python -m transformer sizes --config=configs/llama3_8b.py
    python -m transformer compile --config=configs/llama3_8b.py --target=v5p:4x4x4
"""

from transformer.config import base_config


def get_config():
    c = base_config()
    # SwiGLU's hidden width is 2/3 of d_ff: 21504 gives Llama's 14336.
    c.model.update(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                   d_ff=21504, max_seq_len=8192, position="rope", norm="rmsnorm",
                   mlp="swiglu", bias=False, tie_embeddings=False, dtype="bfloat16",
                   scan_layers=True, remat="block")
    c.data.tokenizer = "bpe"
    c.data.bpe_vocab_size = 128256
    c.train.update(batch_size=256, lr=3e-4)  # 2M tokens per batch
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    return c

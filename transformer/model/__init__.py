"""The model room: what a transformer computes, top to bottom, and what it costs.

    gpt.py         the forward pass: embed → blocks (attention, MLP) → norm → logits
    attention.py   softmax(QKᵀ/√d_k)·V once, with a compute dtype; the masks; the causal split
    rope.py        rotary position embeddings
    kvcache.py     the KV cache's layout: allocate, write, read, prefix
    flops.py       parameters, FLOPs, KV-cache and activation bytes, by arithmetic
    sizes.py       those figures for a config as a table (what `python -m transformer sizes` prints)
    kernels/       the seam: how the matmuls run, and what `model.matmul=auto` means here

May import: config/. Never: data/, train/, generate/, hf/, scaling/, tools/ or the command lines.
"""

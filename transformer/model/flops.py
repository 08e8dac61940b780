"""Parameters, FLOPs and memory of a model, from its shape alone (pure arithmetic, no arrays).

    from transformer.config import ModelConfig
    from transformer import flops
    c = ModelConfig(vocab_size=50257, d_model=12288, n_layers=96, n_heads=96, d_ff=49152,
                    max_seq_len=2048)
    flops.param_counts(c)["total"]       # 174.6e9: GPT-3
    flops.train_flops_per_token(c)       # 6 N + the attention term

The counts follow `model/gpt.py` layer by layer (D d_model, K head dim, H query heads, G key/value
heads, F MLP width, V vocabulary, T context, L layers):
    token embedding  V·D            position embedding  T·D (none with RoPE)
    attention        Q: D·H·K + H·K   K, V: D·G·K + G·K each   O: H·K·D + D
    MLP              D·F + F  +  F·D + D   (SwiGLU: a third matrix, F = 2/3 d_ff)
    norms            2 per block, 1 final (pre-norm only); 2D each (LayerNorm) or D (RMSNorm)
    head             V·D, only when untied (tied: logits = h·E^T reuse the embedding)
`tests/test_flops.py` checks these against the real initialised parameters.

FLOPs count a multiply-add as 2. The forward pass does 2 FLOPs per weight of every matmul
(the non-embedding weights plus the output head, tied or not; an embedding lookup is free) and
attention's two score matmuls, Q·K^T and weights·V, 2·D FLOPs each per (query, key) pair.
Causal attention lets query t see t+1 keys, (T+1)/2 on average, so per token and layer the
attention term is 2·2·D·(T+1)/2: the lower triangle is counted once, where the Chinchilla
paper (Hoffmann et al. 2022, Table 4) counts the full T×T square, i.e. twice. Kaplan et al.
(2020, Table 1) give the same 2·L·T·D. Training = forward + backward = 3 × forward, which is
the familiar 6N + 6·L·D·(T+1) per token.
"""

from __future__ import annotations

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def n_kv_heads(c) -> int:
    """Key/value heads: n_heads, or fewer with grouped-query / multi-query attention."""
    return c.kv_heads


def _mlp_params(c) -> int:
    """relu / gelu: D·F + F + F·D + D. swiglu: gate and up D·F' + F' each, down F'·D + D,
    with F' = ModelConfig.mlp_hidden (about 2/3 of d_ff)."""
    D, F = c.d_model, c.mlp_hidden
    matrices = 3 if c.mlp == "swiglu" else 2
    b = 1 if c.bias else 0  # model.bias=False: kernels only
    return (matrices - 1) * (D * F + b * F) + F * D + b * D


def _norm_params(c) -> int:
    """Per-block norms plus the final one (pre-norm only). LayerNorm: scale and bias;
    RMSNorm, or LayerNorm with model.bias=False: scale only. QK-norm: a gain over the head
    dim for the queries and one for the keys, per block."""
    per_norm = c.d_model * (1 if c.norm == "rmsnorm" or not c.bias else 2)
    qk = c.n_layers * 2 * c.head_dim if c.qk_norm else 0
    return (c.n_layers * 2 + (1 if c.norm_placement == "pre" else 0)) * per_norm + qk


def _nanochat_piece_params(c) -> dict:
    """model.value_embeds' tables (embeddings: looked up, never multiplied) and the few
    gates and gains of value embeddings, smear, backout and x0_lambdas (model/gpt.py)."""
    from transformer.model.gpt import GATE_CHANNELS, value_embed_layers
    G, K, C = n_kv_heads(c), c.head_dim, min(GATE_CHANNELS, c.d_model)
    ve = len(value_embed_layers(c))
    gains = (ve * C * G + (C + 1 if c.smear else 0) + (1 if c.backout else 0)
             + (2 * c.n_layers if c.x0_lambdas else 0))
    return {"value_embeddings": ve * c.vocab_size * G * K, "gates_and_gains": gains}


def param_counts(c) -> dict:
    """Parameters by component, plus `total` and `non_embedding` (Kaplan's N: everything but
    the token and position embeddings; an untied head counts as embedding too)."""
    D, K, H, G, L = c.d_model, c.head_dim, c.n_heads, n_kv_heads(c), c.n_layers
    b = 1 if c.bias else 0
    counts = {
        "token_embedding": c.vocab_size * D,
        "position_embedding": c.max_seq_len * D if c.position == "learned" else 0,
        "attention_q": L * (D * H * K + b * H * K),
        "attention_k": L * (D * G * K + b * G * K),
        "attention_v": L * (D * G * K + b * G * K),
        "attention_o": L * (H * K * D + b * D),
        "mlp": L * _mlp_params(c),
        "norms": _norm_params(c),
        "head": 0 if c.tie_embeddings else c.vocab_size * D,
        **_nanochat_piece_params(c),
    }
    embedding = (counts["token_embedding"] + counts["position_embedding"] + counts["head"]
                 + counts["value_embeddings"])
    counts["total"] = sum(counts.values())
    counts["non_embedding"] = counts["total"] - embedding
    return counts


def matmul_weights(c) -> int:
    """Weights that take part in a matmul per token: every block's kernels plus the head."""
    D, K, H, G, L = c.d_model, c.head_dim, c.n_heads, n_kv_heads(c), c.n_layers
    F, matrices = c.mlp_hidden, (3 if c.mlp == "swiglu" else 2)
    per_block = D * H * K + 2 * D * G * K + H * K * D + matrices * D * F
    return L * per_block + c.vocab_size * D


def attention_flops_per_token(c, context: int | None = None) -> float:
    """Forward FLOPs of Q·K^T and weights·V per token, causal: (T+1)/2 keys on average
    (with a sliding window w, query t sees min(t+1, w) keys)."""
    T = c.max_seq_len if context is None else context
    w = c.sliding_window
    keys = (T + 1) / 2 if not w or w >= T else (w * (w + 1) / 2 + (T - w) * w) / T
    return c.n_layers * 2 * 2 * c.n_heads * c.head_dim * keys


def forward_flops_per_token(c, context: int | None = None) -> float:
    return 2 * matmul_weights(c) + attention_flops_per_token(c, context)


def train_flops_per_token(c, context: int | None = None) -> float:
    """Forward plus backward (twice the forward): 6N + 6·L·D·(T+1) for multi-head attention."""
    return 3 * forward_flops_per_token(c, context)


def recompute_flops_per_token(c, context: int | None = None) -> float:
    """FLOPs the backward pass repeats under model.remat (not model FLOPs: MFU leaves them out,
    the chip still spends them): 'block' runs each block's forward again; 'dots' keeps the
    matmuls without batch dimensions and recomputes attention's two score matmuls; 'none'
    nothing."""
    if c.remat == "block":
        return forward_flops_per_token(c, context) - 2 * c.vocab_size * c.d_model
    if c.remat == "dots":
        return attention_flops_per_token(c, context)
    return 0.0


def kv_cache_bytes_per_token(c, dtype: str | None = None) -> int:
    """K and V of every layer for one position."""
    return 2 * c.n_layers * n_kv_heads(c) * c.head_dim * BYTES[dtype or c.dtype]


def kv_cache_bytes(c, batch: int, dtype: str | None = None) -> int:
    """A full-context cache (max_seq_len slots) for `batch` sequences."""
    return kv_cache_bytes_per_token(c, dtype) * c.max_seq_len * batch


def activation_bytes(c, batch: int, remat: str | None = None) -> int:
    """A rough peak of the activations one training step keeps for the backward pass.

    Per block, Korthikanti et al. 2022 ("Reducing Activation Recomputation", eq. 1) count
    T·B·D·(34 + 5·H·T/D) bytes with 16-bit activations; we scale by the compute dtype's
    width over 2. With remat='block' only each block's input is kept, plus one block's full
    set while it is recomputed. remat='dots' (`checkpoint_dots_with_no_batch_dims`) keeps,
    besides the block's input, the outputs of the matmuls without batch dimensions that the
    backward pass needs: Q (H·K), K and V (G·K each), W_O (D) and the MLP's expansion (F,
    twice with SwiGLU's gate) per token; not attention's batched score matmuls, and not the
    MLP's projection, which only enters a sum (the next block's input, kept anyway). This
    equals what JAX saves (jax's saved_residuals; tests/test_flops.py).
    The float32 logits and their gradient add 2·B·T·V·4 bytes.
    """
    T, D, H, L = c.max_seq_len, c.d_model, c.n_heads, c.n_layers
    width = BYTES[c.dtype] / 2
    per_block = T * batch * D * (34 + 5 * H * T / D) * width
    remat = c.remat if remat is None else remat
    if remat == "none":
        blocks = L * per_block
    else:  # the inputs of every block (and with 'dots' its projections' outputs), plus one
        kept = D  # block's worth live at a time while it is recomputed
        if remat == "dots":
            K, G, F = c.head_dim, n_kv_heads(c), c.mlp_hidden
            kept += H * K + 2 * G * K + D + (2 if c.mlp == "swiglu" else 1) * F
        blocks = L * T * batch * kept * BYTES[c.dtype] + per_block
    return int(blocks + 2 * batch * T * c.vocab_size * 4)

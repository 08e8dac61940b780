"""A GPT-style decoder, top to bottom in the order of the forward pass.

    x      = E[tokens] + P[positions]                  token embedding plus learned position
    for each of the N blocks (pre-norm):
      x    = x + W_O · Attention(LN(x) W_Q, LN(x) W_K, LN(x) W_V)   causal multi-head attention
      x    = x + W_2 · GELU(LN(x) W_1)                 the MLP: expand, non-linearity, project back
    logits = LN(x) E^T                                 output head tied to the embedding

That is GPT-2's design, the block of the base config (config/fields.py's base values); the
default config, configs/default.py, swaps in RoPE, RMSNorm and SwiGLU. The parts can be swapped
by config (docs/inside.md):
    model.position=rope          no P; Q and K are rotated by their positions (rope.py)
    model.norm=rmsnorm           RMSNorm(x) = x / rms(x) · g instead of LayerNorm
    model.norm_placement=post    x = LN(x + Attention(x)); x = LN(x + MLP(x)); no final LN
    model.mlp=relu|swiglu|relu2  W_2 · ReLU(x W_1), W_2 · (SiLU(x W_gate) ⊙ x W_1), W_2 · ReLU(x W_1)²
    model.bias=False             no biases: every x W + b is x W, LayerNorm has no β
    model.qk_norm=True           q, k = RMSNorm(q), RMSNorm(k) per head, over K, before RoPE
    model.zero_init_out=True     W_O and W_2 start at 0: every block starts as the identity
    model.logit_softcap=c        logits = c · tanh(logits / c), bounded in (-c, c)
    model.vocab_used=n           logits of the padding ids n .. V-1 are -inf: never predicted
    model.n_kv_heads=G           G key/value heads shared by groups of query heads
    model.sliding_window=w       each position attends to the last w positions only
    model.attention_kernel=jax   jax.nn.dot_product_attention instead of the einsums (XLA's)
    model.smear=True             x_t += λ·σ(x_t[:12]·w)·x_{t-1} after the embedding (nanochat)
    model.value_embeds=alternate every other block (the last included) adds a token table to V
    model.backout=True           the last block's output minus λ·(the stream after block L//2)
    model.x0_lambdas=True        block i reads r_i·x + a_i·x0, x0 the embedding (learned r, a)
    model.attention_kernel=cudnn the same with cuDNN flash attention (NVIDIA GPU, bfloat16)
How the matmuls are computed (flax's layers and autodiff, or hand-written backward passes for
CPU) is not this file's business: it asks `kernels.for_model(config)` for its dense layers
and attention.

Shapes: B batch, T positions, D d_model, H heads, G key/value heads, K head dim (D = H·K),
F MLP width, V vocabulary, S cache slots, L layers. Parameters carry logical axis names
(`embed`, `heads`, `mlp`, `vocab`, ...) that `sharding.py` maps onto a device mesh.

The same module runs training (tokens → logits) and cached generation (tokens + KV cache →
logits + updated cache); the cached path always runs the blocks unrolled so that each layer
has its own cache arrays (see `unstack_layers`). Attention weights, queries, keys and values
are sown into the `intermediates` collection (`apply(..., mutable=["intermediates"])`), which
is how visualize.py and explain.py look inside; every attention path sows its weights except
the `jax` kernel, which never forms them.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.config import ModelConfig
from transformer.model import attention, kernels, kvcache, rope

# GPT-2's initialisation: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2L).
INIT_STD = 0.02


class _AxisNames(nn.LogicallyPartitioned):
    """Logical axis names as metadata only: unboxing adds no sharding constraint.

    Flax's default constrains a parameter whenever it is unboxed, and DenseGeneral unboxes
    its flat [D, H*K] kernel before reshaping it to [D, H, K]: under a mesh the 3-name
    constraint then refuses the 2-D array. Jitted programs place the parameters through
    their in/out shardings (sharding.py) anyway.
    """

    def unbox(self, apply_constraint=True):
        return super().unbox(apply_constraint=False)


def _logical(init, names):
    def boxed(*args, **kwargs):
        return _AxisNames(init(*args, **kwargs), names)
    return boxed


def _norm(config: ModelConfig, name: str) -> nn.Module:
    """LayerNorm: (x - mean) / std · g + b.  RMSNorm: x / sqrt(mean(x²)) · g (no centring,
    no bias: cheaper, and works as well in practice). The statistics are float32; the
    output is in the compute dtype, as every other layer's: left to flax's promotion, a
    bfloat16 input and the float32 gain gave float32, and a post-norm block handed the next
    one a float32 residual stream (which nn.scan refuses: its carry changed dtype)."""
    scale_init = _logical(nn.initializers.ones, ("embed",))
    if config.norm == "rmsnorm":
        return nn.RMSNorm(epsilon=1e-5, name=name, scale_init=scale_init, dtype=config.dtype)
    return nn.LayerNorm(epsilon=1e-5, name=name, scale_init=scale_init, use_bias=config.bias,
                        bias_init=_logical(nn.initializers.zeros, ("embed",)),
                        dtype=config.dtype)


def _head_norm(config: ModelConfig, name: str) -> nn.Module:
    """QK-norm: RMSNorm of each head's vector over its K dims, one learned gain per dim shared
    by the heads (Qwen3's q_norm / k_norm). Scores q·k are then bounded by |g_q|·|g_k|·K, so
    attention logits cannot grow with the weights (stability at high learning rates).
    Output in the compute dtype, as `_norm`'s: float32 queries and keys beside bfloat16
    values made attention run in float32, or fail (jax.nn.dot_product_attention, cuDNN)."""
    return nn.RMSNorm(epsilon=1e-5, name=name, dtype=config.dtype,
                      scale_init=_logical(nn.initializers.ones, ("head_dim",)))


def _residual_init(config: ModelConfig):
    """The two projections that write into the residual stream: GPT-2's N(0, 0.02/√(2L)), or
    zeros (modded-nanogpt), so that every block starts as the identity map."""
    if config.zero_init_out:
        return nn.initializers.zeros
    return nn.initializers.normal(INIT_STD / (2 * config.n_layers) ** 0.5)


# nanochat's gates read a token's first few channels only: a cheap, per-token decision.
GATE_CHANNELS = 12


def _small_positive(key, shape, dtype=jnp.float32):
    """U(0, 0.02): gates that start just above σ(0) (nanochat's init)."""
    return jax.random.uniform(key, shape, dtype, 0.0, 0.02)


class CausalSelfAttention(nn.Module):
    """Multi-head attention: project to Q, K, V, attend per head, concatenate, project with W_O."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, mask, positions_BT, cache=None, index=None, ve_BTGK=None):
        c = self.config
        H, G, K = c.n_heads, c.kv_heads, c.head_dim
        ops = kernels.for_model(c)  # how the matmuls are computed: the seam decides
        init = nn.initializers.normal(INIT_STD)
        out_init = _residual_init(c)

        def project(name, heads, axis):
            return ops.dense((heads, K), name=name, use_bias=c.bias,
                         kernel_init=_logical(init, ("embed", axis, "head_dim")),
                         bias_init=_logical(nn.initializers.zeros, (axis, "head_dim")))

        # Each position asks (Q), advertises (K) and offers (V); Q has H heads, K and V have G.
        kv_axis = "heads" if G == H else "kv_heads"
        q_BHTK = project("query", H, "heads")(x_BTD).transpose(0, 2, 1, 3)
        k_BGTK = project("key", G, kv_axis)(x_BTD).transpose(0, 2, 1, 3)
        v_BTGK = project("value", G, kv_axis)(x_BTD)
        if ve_BTGK is not None:  # the block's value embedding of each token, gated per head
            # ResFormer's value residual, gated as nanochat's: 3·σ(x[:12] W_g) in (0, 3), one
            # gate per token and K/V head, read from the attention input.
            w_CG = self.param("gate", _logical(_small_positive, (None, kv_axis)),
                              (min(GATE_CHANNELS, c.d_model), G), jnp.float32)
            gate_BTG = 3 * jax.nn.sigmoid(x_BTD[..., :GATE_CHANNELS].astype(jnp.float32) @ w_CG)
            v_BTGK = v_BTGK + (gate_BTG[..., None] * ve_BTGK).astype(v_BTGK.dtype)
        v_BGTK = v_BTGK.transpose(0, 2, 1, 3)
        if c.qk_norm:  # before the rotation, as Qwen3: the cache then holds normed keys
            q_BHTK, k_BGTK = _head_norm(c, "q_norm")(q_BHTK), _head_norm(c, "k_norm")(k_BGTK)
        if c.position == "rope":  # rotate by absolute position: scores see only p - s
            q_BHTK = rope.apply(q_BHTK, positions_BT)
            k_BGTK = rope.apply(k_BGTK, positions_BT)
        # Heads split, positions whole (as in the MLP): attention never reshards by position.
        q_BHTK = nn.with_logical_constraint(q_BHTK, ("batch", "heads", None, "head_dim"))
        k_BGTK, v_BGTK = (nn.with_logical_constraint(x, ("batch", kv_axis, None, "head_dim"))
                          for x in (k_BGTK, v_BGTK))
        for name, value in (("queries", q_BHTK), ("keys", k_BGTK), ("values", v_BGTK)):
            self.sow("intermediates", name, value)

        if cache is not None:  # generation: keys and values of earlier tokens come from the cache
            cache = kvcache.write(cache, k_BGTK, v_BGTK, index)
            k_BGSK, v_BGSK = kvcache.read(cache, x_BTD.shape[0])
            out_BHTK, weights_BHTS = ops.cached_attention(q_BHTK, k_BGSK, v_BGSK, mask)
        else:  # training and scoring: the causal triangle only
            out_BHTK, weights_BHTS = ops.self_attention(q_BHTK, k_BGTK, v_BGTK, mask)
        if weights_BHTS is not None:  # None: the `jax` kernel never forms them
            self.sow("intermediates", "attention_weights", weights_BHTS)

        # Concatenating the heads and applying W_O is one contraction over (H, K).
        y_BTD = ops.dense(c.d_model, axis=(-2, -1), name="out", use_bias=c.bias,
                      kernel_init=_logical(out_init, ("heads", "head_dim", "embed")),
                      bias_init=_logical(nn.initializers.zeros, ("embed",)))(
                          out_BHTK.transpose(0, 2, 1, 3))
        return y_BTD, cache


class MLP(nn.Module):
    """Position-wise feed-forward: D → F, non-linearity, F → D.

    relu / gelu / relu2: W_2 · act(x W_1), relu2 being ReLU(x)² (So et al. 2021, "Primer";
    modded-nanogpt, nanochat).  swiglu (Shazeer 2020): W_2 · (SiLU(x W_gate) ⊙ x W_1), with
    F = `ModelConfig.mlp_hidden` = 2/3 · d_ff (rounded to a multiple of 8) so that its three
    matrices hold about as many parameters as the other MLPs' two.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD):
        c = self.config
        F = c.mlp_hidden
        ops = kernels.for_model(c)
        dense = functools.partial(ops.dense, F, use_bias=c.bias,
                                  kernel_init=_logical(nn.initializers.normal(INIT_STD),
                                                       ("embed", "mlp")),
                                  bias_init=_logical(nn.initializers.zeros, ("mlp",)))
        h_BTF = dense(name="expand")(x_BTD)
        # Inside the block the length axis is whole and the hidden units are split (under
        # sequence parallelism only the residual stream is split by position, Megatron-SP):
        # split by position here, the MLP's weights were gathered on every chip instead.
        h_BTF = nn.with_logical_constraint(h_BTF, ("batch", None, "mlp"))
        if c.mlp == "swiglu":
            h_BTF = jax.nn.silu(dense(name="gate")(x_BTD)) * h_BTF
        elif c.mlp == "relu":
            h_BTF = jax.nn.relu(h_BTF)
        elif c.mlp == "relu2":
            h_BTF = jnp.square(jax.nn.relu(h_BTF))
        else:
            h_BTF = jax.nn.gelu(h_BTF, approximate=True)
        return ops.dense(
            c.d_model, name="project", use_bias=c.bias,
            kernel_init=_logical(_residual_init(c), ("mlp", "embed")),
            bias_init=_logical(nn.initializers.zeros, ("embed",)))(h_BTF)


class Block(nn.Module):
    """One transformer block. Pre-norm: x + Attn(N(x)), then x + MLP(N(x)).
    Post-norm (the original): N(x + Attn(x)), then N(x + MLP(x))."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, mask, positions_BT, cache=None, index=None, ve_BTGK=None):
        c = self.config
        attn, mlp = CausalSelfAttention(c, name="attn"), MLP(c, name="mlp")
        norm_attn, norm_mlp = _norm(c, "ln_attn"), _norm(c, "ln_mlp")
        if c.norm_placement == "pre":
            h_BTD, cache = attn(norm_attn(x_BTD), mask, positions_BT, cache, index, ve_BTGK)
            x_BTD = x_BTD + h_BTD
            x_BTD = x_BTD + mlp(norm_mlp(x_BTD))
        else:
            h_BTD, cache = attn(x_BTD, mask, positions_BT, cache, index, ve_BTGK)
            x_BTD = norm_attn(x_BTD + h_BTD)
            x_BTD = norm_mlp(x_BTD + mlp(x_BTD))
        x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "length", "embed"))
        return x_BTD, cache


_REMAT_POLICY = {
    "block": None,  # save nothing inside a block: recompute it all in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class _HeadKernel(nn.Module):
    """The untied head's weights, [D, V], under nn.Dense's names (head/kernel), so that
    checkpoints and the Hugging Face mapping see the layer they always did; the seam
    (kernels.head) multiplies by it."""

    features: int
    param_dtype: object

    @nn.compact
    def __call__(self, d_model: int):
        init = _logical(nn.initializers.normal(INIT_STD), ("embed", "vocab"))
        return self.param("kernel", init, (d_model, self.features), self.param_dtype)


def value_embed_layers(c: ModelConfig) -> tuple[int, ...]:
    """The blocks that add a value embedding (model.value_embeds): every other one ending with
    the last (nanochat), or the first and the last (modded-nanogpt), or all of them, or none."""
    L = c.n_layers
    if c.value_embeds == "alternate":
        return tuple(i for i in range(L) if i % 2 == (L - 1) % 2)
    if c.value_embeds == "ends":
        return tuple(sorted({0, L - 1}))
    if c.value_embeds == "all":
        return tuple(range(L))
    return ()


class Smear(nn.Module):
    """x_t + λ·σ(x_t[:12]·w)·x_{t-1}: each token takes in a gated share of the previous
    token's embedding (nanochat's smear; bigram information before any attention). λ starts
    at 0, so the model starts without it. A text's first token (position 0) has none.

    prev_BTD is x shifted by one position: the previous token's embedding at every t (what
    row t-1 of x is in training; in cached decoding the first new token's comes from the
    cache, `smear_cache`)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, prev_BTD, positions_BT):
        c = self.config
        w_C1 = self.param("gate", _logical(_small_positive, ("embed", None)),
                          (min(GATE_CHANNELS, c.d_model), 1), jnp.float32)
        gain = self.param("gain", _logical(nn.initializers.zeros, (None,)), (1,), jnp.float32)
        gate_BT1 = gain * jax.nn.sigmoid(x_BTD[..., :GATE_CHANNELS].astype(jnp.float32) @ w_C1)
        gate_BT1 = jnp.where(positions_BT[..., None] > 0, gate_BT1, 0.0)
        return x_BTD + (gate_BT1 * prev_BTD).astype(x_BTD.dtype)


def smear_cache(x_BTD, cache_x, slot, start_B):
    """Cached decoding's smear: (the previous token's embedding at each new position, the
    cache's smear array with the new embeddings written). The array, [B·G, S, D/G], holds
    the embedding of every slot in the K/V caches' layout (kvcache.py), so slicing rows,
    prefixes and shardings treat it as one more cache array."""
    B, T, D = x_BTD.shape
    G = cache_x.shape[0] // B
    S = cache_x.shape[1]
    x_BGTC = x_BTD.reshape(B, T, G, D // G).transpose(0, 2, 1, 3)
    cache_x = kvcache.write({"k": cache_x, "v": cache_x}, x_BGTC, x_BGTC, slot)["k"]
    before = (jnp.asarray(slot) - 1) % S  # the slot before the first new token (a ring)
    rows_BGSC = kvcache.read({"k": cache_x, "v": cache_x}, B)[0]
    if jnp.ndim(before) == 0:
        prev_BGC = jax.lax.dynamic_index_in_dim(rows_BGSC, before, axis=2, keepdims=False)
    else:
        prev_BGC = rows_BGSC[jnp.arange(B), :, before]
    prev_B1D = prev_BGC.reshape(B, 1, D).astype(x_BTD.dtype)
    del start_B  # the first real token is at position 0: Smear masks it by position
    return jnp.concatenate([prev_B1D, x_BTD[:, :-1]], axis=1), cache_x


class _Gain(nn.Module):
    """Learned scalars under the leaf name `gain` (not decayed: optimizer.NOT_DECAYED),
    starting at `init` (a number, or nested tuples of them: the shape too)."""

    init: float | tuple

    @nn.compact
    def __call__(self, *_):
        start = jnp.atleast_1d(jnp.asarray(self.init, jnp.float32))
        return self.param("gain", _logical(lambda *_: start, (None,) * start.ndim), start.shape,
                          jnp.float32)


def _residual_gains(c: ModelConfig):
    """model.x0_lambdas' learned [2, L] gains: row 0 scales the residual stream entering
    block i (r_i, from 1.15 down to 1.05), row 1 adds back the embedding x0 (a_i, from 0.2
    down to 0.05): nanochat's initial values, more of x0 early, less later."""
    depth = [i / max(c.n_layers - 1, 1) for i in range(c.n_layers)]
    return _Gain((tuple(1.15 - 0.10 * d for d in depth), tuple(0.20 - 0.15 * d for d in depth)),
                 name="residual_gains")


class GPT(nn.Module):
    """tokens → logits, or (tokens, cache) → (logits, cache) when decoding."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens_BT, positions_BT=None, cache=None, index=None, start_B=None):
        """Full forward pass, or a cached one.

        tokens_BT: int token ids. positions_BT: absolute positions (default 0..T-1).
        Cached decoding also passes `cache` (from `kvcache.init_cache`), `index` (tokens_BT[:, 0]
        is the text's token `index`, counted in slots; it goes to slot index mod max_seq_len)
        and `start_B` (the first real token of each left-padded row), and gets back
        (logits_BTV, new_cache). T > 1 new tokens must not cross the cache's end. Logits are
        float32.
        """
        c = self.config
        B, T = tokens_BT.shape
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(jnp.arange(T), (B, T))

        embed = nn.Embed(c.vocab_size, c.d_model, dtype=c.dtype, param_dtype=c.param_dtype,
                         name="embed",
                         embedding_init=_logical(nn.initializers.normal(INIT_STD),
                                                 ("vocab", "embed")))
        x_BTD = embed(tokens_BT)
        if c.position == "learned":  # with rope, positions enter inside attention instead
            pos_embed = self.param("pos_embed", _logical(nn.initializers.normal(INIT_STD / 2),
                                                         ("length", "embed")),
                                   (c.max_seq_len, c.d_model), c.param_dtype)
            x_BTD = x_BTD + jnp.take(pos_embed, positions_BT, axis=0).astype(c.dtype)
        x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "length", "embed"))

        ve = self._value_embeds(tokens_BT)  # {block: [B, T, G, K]}, model.value_embeds
        if cache is None:
            mask = attention.causal_mask(T, c.sliding_window)
            if c.smear:  # row t-1 of x is token t's previous one (row 0: none, masked)
                prev_BTD = jnp.pad(x_BTD[:, :-1], ((0, 0), (1, 0), (0, 0)))
                x_BTD = Smear(c, name="smear")(x_BTD, prev_BTD, positions_BT)
            x_BTD = self._blocks(x_BTD, mask, positions_BT, ve)
            new_cache = None
        else:
            S = cache[0]["k"].shape[1]  # the slots held: max_seq_len, or the first S of them
            mask = attention.cache_mask(start_B, index, T, S, c.sliding_window, c.max_seq_len)
            slot = index % c.max_seq_len  # a ring once generation outgrows the context
            if c.smear:
                prev_BTD, smeared = smear_cache(x_BTD, cache[0]["x"], slot, start_B)
                x_BTD = Smear(c, name="smear")(x_BTD, prev_BTD, positions_BT)
            x_BTD, new_cache = self._unrolled(Block, x_BTD, mask, positions_BT, ve, cache, slot)
            if c.smear:
                new_cache[0] = {**new_cache[0], "x": smeared}

        # Post-norm blocks already end in a norm; pre-norm leaves the residual stream raw.
        h_BTD = _norm(c, "ln_final")(x_BTD) if c.norm_placement == "pre" else x_BTD
        # logits = h W, W the embedding transposed (tied) or the head's own [D, V] kernel,
        # summed in float32 whatever the compute dtype: a bfloat16 result would round every
        # logit (spacing 0.0625 at |logit| ≈ 10) before the softmax and the loss see it.
        head = kernels.for_model(c).head
        if c.tie_embeddings:
            logits_BTV = head(h_BTD, embed.embedding, tied=True)
        else:
            logits_BTV = head(h_BTD, _HeadKernel(c.vocab_size, c.param_dtype, name="head")(
                c.d_model))
        logits_BTV = logits_BTV.astype(jnp.float32)
        if c.logit_softcap:  # smooth and bounded: |logit| < c, ≈ the logit itself when small
            logits_BTV = c.logit_softcap * jnp.tanh(logits_BTV / c.logit_softcap)
        if c.vocab_used:  # padding ids (vocab_multiple): probability exactly 0, everywhere
            real_V = jnp.arange(c.vocab_size) < c.vocab_used
            logits_BTV = jnp.where(real_V, logits_BTV, -jnp.inf)
        return logits_BTV if cache is None else (logits_BTV, new_cache)

    def _value_embeds(self, tokens_BT):
        """Each value-embedding block's table looked up: {block: [B, T, G, K]}."""
        c = self.config
        if c.value_embeds != "none" and c.scan_layers:
            raise ValueError("model.value_embeds needs model.scan_layers=False")
        out = {}
        for i in value_embed_layers(c):
            table = nn.Embed(c.vocab_size, c.kv_heads * c.head_dim, dtype=c.dtype,
                             param_dtype=c.param_dtype, name=f"value_embed_{i}",
                             embedding_init=_logical(nn.initializers.normal(INIT_STD),
                                                     ("vocab", "embed")))
            B, T = tokens_BT.shape
            out[i] = table(tokens_BT).reshape(B, T, c.kv_heads, c.head_dim)
        return out

    def _unrolled(self, block, x_BTD, mask, positions_BT, ve, cache=None, slot=None):
        """The blocks one by one (with `cache`: each its own layer's), backout at the end."""
        c = self.config
        new_cache, x_mid_BTD, x0_BTD = [], None, x_BTD
        gains_2L = _residual_gains(c)() if c.x0_lambdas else None
        for i in range(c.n_layers):
            if gains_2L is not None:  # x = r_i·x + a_i·x0 (nanochat; modded-nanogpt)
                x_BTD = (gains_2L[0, i] * x_BTD + gains_2L[1, i] * x0_BTD).astype(x_BTD.dtype)
            layer = None if cache is None else {"k": cache[i]["k"], "v": cache[i]["v"]}
            x_BTD, layer = block(c, name=f"block_{i}")(x_BTD, mask, positions_BT, layer, slot,
                                                       ve.get(i))
            new_cache.append(layer)
            if i == c.n_layers // 2:
                x_mid_BTD = x_BTD
        if c.backout:  # nanochat: the early layers' features taken back out before the head
            x_BTD = x_BTD - (_Gain(0.2, name="backout")() * x_mid_BTD).astype(x_BTD.dtype)
        return x_BTD, new_cache

    def _blocks(self, x_BTD, mask, positions_BT, ve=None):
        c = self.config
        block = Block
        if c.remat != "none":
            block = nn.remat(Block, policy=_REMAT_POLICY[c.remat], prevent_cse=not c.scan_layers)
        if c.scan_layers:
            if c.backout or c.x0_lambdas:
                raise ValueError("model.backout and model.x0_lambdas need model.scan_layers="
                                 "False")
            # One block body, its parameters stacked along a leading `layers` axis.
            stack = nn.scan(block, length=c.n_layers,
                            variable_axes={"params": 0, "intermediates": 0},
                            split_rngs={"params": True}, in_axes=(nn.broadcast, nn.broadcast),
                            metadata_params={nn.PARTITION_NAME: "layers"})
            x_BTD, _ = stack(c, name="blocks")(x_BTD, mask, positions_BT)
            return x_BTD
        return self._unrolled(block, x_BTD, mask, positions_BT, ve or {})[0]


def init_params(config: ModelConfig, key: jax.Array):
    """Parameters for `config`, a pure function of the key (logical-axis boxes removed)."""
    tokens = jnp.zeros((1, min(8, config.max_seq_len)), jnp.int32)
    return nn.unbox(GPT(config).init(key, tokens)["params"])


@functools.lru_cache(maxsize=32)
def logical_axes(config: ModelConfig):
    """The logical axis names of every parameter, without allocating any of them. Cached per
    config (tracing the model's init costs ~0.3 s, and a run asks for its training state, its
    sampler and its checkpoint restore); callers must not mutate the tree."""
    tokens = jnp.zeros((1, min(8, config.max_seq_len)), jnp.int32)
    boxed = jax.eval_shape(GPT(config).init, jax.random.key(0), tokens)["params"]
    return nn.get_partition_spec(boxed)


def unstack_layers(params, n_layers: int):
    """Scanned params ({'blocks': leaves with a leading L axis}) → {'block_0': ..., ...}.

    Decoding always runs unrolled with one cache per layer; unstacking once, outside the
    decode loop, keeps each step from slicing (and copying) the stacked weights.
    """
    if "blocks" not in params:
        return params
    out = {k: v for k, v in params.items() if k != "blocks"}
    for i in range(n_layers):
        out[f"block_{i}"] = jax.tree.map(lambda x, i=i: x[i], params["blocks"])
    return out


def stack_layers(params, n_layers: int):
    """The inverse of `unstack_layers`: unrolled params → the layout `scan_layers=True` uses."""
    if "blocks" in params:
        return params
    out = {k: v for k, v in params.items() if not k.startswith("block_")}
    layers = [params[f"block_{i}"] for i in range(n_layers)]
    out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return out


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))

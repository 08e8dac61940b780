"""A GPT-style decoder, top to bottom in the order of the forward pass.

    x      = E[tokens] + P[positions]                  token embedding plus learned position
    for each of the N blocks (pre-norm):
      x    = x + W_O · Attention(LN(x) W_Q, LN(x) W_K, LN(x) W_V)   causal multi-head attention
      x    = x + W_2 · GELU(LN(x) W_1)                 the MLP: expand, non-linearity, project back
    logits = LN(x) E^T                                 output head tied to the embedding

Shapes: B batch, T positions, D d_model, H heads, K head dim (D = H·K), F MLP width,
V vocabulary, S cache slots, L layers. Parameters carry logical axis names (`embed`,
`heads`, `mlp`, `vocab`, ...) that `sharding.py` maps onto a device mesh.

The same module runs training (tokens → logits) and cached generation (tokens + KV cache →
logits + updated cache); the cached path always runs the blocks unrolled so that each layer
has its own cache arrays (see `unstack_layers`).
"""

from __future__ import annotations


import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import attention, fastdense, kvcache
from transformer.config import ModelConfig

# GPT-2's initialisation: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2L).
INIT_STD = 0.02


def _logical(init, names):
    return nn.with_logical_partitioning(init, names)


def _norm(name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=1e-5, name=name,
                        scale_init=_logical(nn.initializers.ones, ("embed",)),
                        bias_init=_logical(nn.initializers.zeros, ("embed",)))


class CausalSelfAttention(nn.Module):
    """Multi-head attention: project to Q, K, V, attend per head, concatenate, project with W_O."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, mask, cache=None, index=None):
        c = self.config
        H, K = c.n_heads, c.head_dim
        dense = fastdense.factory(c)  # nn.DenseGeneral, or the CPU fast path
        init = nn.initializers.normal(INIT_STD)
        out_init = nn.initializers.normal(INIT_STD / (2 * c.n_layers) ** 0.5)

        def project(name):
            return dense((H, K), name=name,
                         kernel_init=_logical(init, ("embed", "heads", "head_dim")),
                         bias_init=_logical(nn.initializers.zeros, ("heads", "head_dim")))

        # Each position asks (Q), advertises (K) and offers (V); one set per head.
        q_BHTK = project("query")(x_BTD).transpose(0, 2, 1, 3)
        k_BHTK = project("key")(x_BTD).transpose(0, 2, 1, 3)
        v_BHTK = project("value")(x_BTD).transpose(0, 2, 1, 3)

        if cache is not None:  # generation: keys and values of earlier tokens come from the cache
            cache = kvcache.write(cache, k_BHTK, v_BHTK, index)
            k_BHSK, v_BHSK = cache["k"], cache["v"]
        else:
            k_BHSK, v_BHSK = k_BHTK, v_BHTK
            q_BHTK, k_BHSK, v_BHSK = fastdense.attention_inputs(c, q_BHTK, k_BHSK, v_BHSK)

        out_BHTK, weights_BHTS = attention.dot_product_attention(q_BHTK, k_BHSK, v_BHSK, mask)
        self.sow("intermediates", "attention_weights", weights_BHTS)

        # Concatenating the heads and applying W_O is one contraction over (H, K).
        y_BTD = dense(c.d_model, axis=(-2, -1), name="out",
                      kernel_init=_logical(out_init, ("heads", "head_dim", "embed")),
                      bias_init=_logical(nn.initializers.zeros, ("embed",)))(
                          out_BHTK.transpose(0, 2, 1, 3))
        return y_BTD, cache


class MLP(nn.Module):
    """Position-wise feed-forward: D → F, GELU, F → D."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD):
        c = self.config
        dense = fastdense.factory(c, nn.Dense)  # nn.Dense, or the CPU fast path
        h_BTF = dense(c.d_ff, name="expand",
                      kernel_init=_logical(nn.initializers.normal(INIT_STD), ("embed", "mlp")),
                      bias_init=_logical(nn.initializers.zeros, ("mlp",)))(x_BTD)
        h_BTF = nn.with_logical_constraint(h_BTF, ("batch", "length", "mlp"))
        h_BTF = jax.nn.gelu(h_BTF, approximate=True)
        out_init = nn.initializers.normal(INIT_STD / (2 * c.n_layers) ** 0.5)
        return dense(c.d_model, name="project",
                     kernel_init=_logical(out_init, ("mlp", "embed")),
                     bias_init=_logical(nn.initializers.zeros, ("embed",)))(h_BTF)


class Block(nn.Module):
    """One pre-norm transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BTD, mask, cache=None, index=None):
        h_BTD, cache = CausalSelfAttention(self.config, name="attn")(
            _norm("ln_attn")(x_BTD), mask, cache, index)
        x_BTD = x_BTD + h_BTD
        x_BTD = x_BTD + MLP(self.config, name="mlp")(_norm("ln_mlp")(x_BTD))
        x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "length", "embed"))
        return x_BTD, cache


_REMAT_POLICY = {
    "block": None,  # save nothing inside a block: recompute it all in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class GPT(nn.Module):
    """tokens → logits, or (tokens, cache) → (logits, cache) when decoding."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens_BT, positions_BT=None, cache=None, index=None, start_B=None):
        """Full forward pass, or a cached one.

        tokens_BT: int token ids. positions_BT: absolute positions (default 0..T-1).
        Cached decoding also passes `cache` (from `kvcache.init_cache`), `index` (the slot
        of tokens_BT[:, 0]) and `start_B` (the first real slot of each left-padded row),
        and gets back (logits_BTV, new_cache). Logits are float32.
        """
        c = self.config
        B, T = tokens_BT.shape
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(jnp.arange(T), (B, T))

        embed = nn.Embed(c.vocab_size, c.d_model, dtype=c.dtype, param_dtype=c.param_dtype,
                         name="embed",
                         embedding_init=_logical(nn.initializers.normal(INIT_STD),
                                                 ("vocab", "embed")))
        pos_embed = self.param("pos_embed",
                               _logical(nn.initializers.normal(INIT_STD / 2), ("length", "embed")),
                               (c.max_seq_len, c.d_model), c.param_dtype)
        x_BTD = embed(tokens_BT) + jnp.take(pos_embed, positions_BT, axis=0).astype(c.dtype)
        x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "length", "embed"))

        if cache is None:
            mask = attention.causal_mask(T)
            x_BTD = self._blocks(x_BTD, mask)
            new_cache = None
        else:
            mask = attention.cache_mask(start_B, index, T, c.max_seq_len)
            new_cache = []
            for i, layer_cache in enumerate(cache):
                x_BTD, layer_cache = Block(c, name=f"block_{i}")(x_BTD, mask, layer_cache, index)
                new_cache.append(layer_cache)

        h_BTD = _norm("ln_final")(x_BTD)
        if c.tie_embeddings:
            logits_BTV = embed.attend(h_BTD)
        else:
            logits_BTV = nn.Dense(c.vocab_size, use_bias=False, dtype=c.dtype,
                                  param_dtype=c.param_dtype, name="head",
                                  kernel_init=_logical(nn.initializers.normal(INIT_STD),
                                                       ("embed", "vocab")))(h_BTD)
        logits_BTV = logits_BTV.astype(jnp.float32)
        return logits_BTV if cache is None else (logits_BTV, new_cache)

    def _blocks(self, x_BTD, mask):
        c = self.config
        block = Block
        if c.remat != "none":
            block = nn.remat(Block, policy=_REMAT_POLICY[c.remat], prevent_cse=not c.scan_layers)
        if c.scan_layers:
            # One block body, its parameters stacked along a leading `layers` axis.
            stack = nn.scan(block, length=c.n_layers,
                            variable_axes={"params": 0, "intermediates": 0},
                            split_rngs={"params": True}, in_axes=(nn.broadcast,),
                            metadata_params={nn.PARTITION_NAME: "layers"})
            x_BTD, _ = stack(c, name="blocks")(x_BTD, mask)
            return x_BTD
        for i in range(c.n_layers):
            x_BTD, _ = block(c, name=f"block_{i}")(x_BTD, mask)
        return x_BTD


def init_params(config: ModelConfig, key: jax.Array):
    """Parameters for `config`, a pure function of the key (logical-axis boxes removed)."""
    tokens = jnp.zeros((1, min(8, config.max_seq_len)), jnp.int32)
    return nn.unbox(GPT(config).init(key, tokens)["params"])


def logical_axes(config: ModelConfig):
    """The logical axis names of every parameter, without allocating any of them."""
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

"""The decode core: what one step over the KV cache does, written once for both drivers.

    config, params = step.setup(config, params, batch)     layers unstacked, decode kernels
    cache, token_B = step.prefill(config, params, cache, tokens_BT, start_B, last, keys_B2, knobs)
    cache, token_B = step.next_token(config, params, cache, token_B, index, start_B, keys_B2,
                                     knobs)
    tokens_BW, start_B = step.reprefill_window(history_BS, token_B, start_B)

Two drivers run these inside their own compiled loops:
- `decode.py` (sample.py, the bench, train.py's sample): one batch whose rows share a slot
  index, prefilled together, then `lax.while_loop`s until every row has ended;
- `slots.py` (the server): rows that join and leave one running batch, each with its own slot
  index and knobs, CHUNK steps per device call.
So `index` (the slot a token goes to, counted from the text's start; the model writes slot
index mod S) is one scalar for the batch or one per row ([B]), and the knobs (temperature,
top_k, top_p) are scalars or one per row: scalars sample with `sampling.sample`, whose greedy
branch skips the draw; per-row knobs with `sampling.sample_rows`. Row b's token i is drawn with
the key data `token_key(key, b, i)` whatever the driver, so both give a text the same tokens.

The window policy (what happens once all S slots are filled) is decided here too:
"roll" (RoPE with a sliding window shorter than the context: the cache is a ring and decoding
never stops) or "reprefill" (the last W = S/2 tokens prefilled again at slots 0 .. W-1,
positions from 0): decode.py's module doc says why each is exact or how it approximates.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import INT32_MAX, ModelConfig
from transformer.generate import sampling
from transformer.model import kernels, kvcache
from transformer.model.gpt import GPT, unstack_layers

# What both drivers (and the server around slots.py) share: the id written where a row made
# no token, the padded prompt lengths, the tokens per streamed chunk, the seeds, the cache.
PAD_ID = 0
MIN_BUCKET = 16  # the shortest padded prompt; prompts pad to powers of two from here
# Tokens a compiled program hands the host at a time while it streams (decode.py's `_deliver`,
# slots.py's chunk): a host call per token cost about as much as the decode step itself on a
# busy CPU.
STREAM_EVERY = 16
MAX_SEED = INT32_MAX  # seeds of sample.py and the server alike: a JAX key holds 32 bits


def bucket(n: int, cap: int | None = None) -> int:
    """The next power of two >= n, at least MIN_BUCKET (at most `cap`)."""
    size = MIN_BUCKET
    while size < n:
        size *= 2
    return size if cap is None else min(size, cap)


def prompt_bucket(longest: int, max_seq_len: int) -> int:
    """The padded prompt length: the next power of two >= longest (at least 16), at most S."""
    return bucket(longest, max_seq_len)


@functools.partial(jax.jit, static_argnames=("config", "batch"))
def new_cache(*, config: ModelConfig, batch: int):
    """An empty KV cache for `batch` rows of the model's whole context (with model.smear, each
    slot's previous-token embedding beside layer 0's K/V)."""
    return kvcache.init_cache(batch, config.n_layers, config.kv_heads, config.max_seq_len,
                              config.head_dim, jnp.dtype(config.dtype),
                              config.d_model * config.smear)


def setup(config: ModelConfig, params, batch: int):
    """(config, params) as decoding runs them: each layer's weights as arrays of their own
    (unstacked once, outside the loop: slicing stacked weights in the step copied them all
    every token) and the kernel seam's decode choice for `batch` rows (bf16 or not)."""
    config = dataclasses.replace(config, scan_layers=False)
    params = unstack_layers(params, config.n_layers)
    return kernels.decode_setup(config, params, batch)


def positions(index, T: int, start_B):
    """[B, T]: each row counts positions from its first real token (slot start_B); padding
    slots get position 0. `index`: the first token's slot, one for all rows or one per row."""
    index_B1 = jnp.reshape(index, (-1, 1))
    return jnp.maximum(index_B1 + jnp.arange(T)[None, :] - start_B[:, None], 0)


def forward(config: ModelConfig, params, tokens_BT, cache, index, start_B):
    """The one function decoding needs from the model: tokens + cache → logits + cache."""
    return GPT(config).apply({"params": params}, tokens_BT,
                             positions(index, tokens_BT.shape[1], start_B),
                             cache=cache, index=index, start_B=start_B)


def token_key(key, row, i):
    """The key data of token i of row `row`: fold_in(fold_in(key, row), i). The first k tokens
    do not depend on how many are asked for, and row b's not on how many rows decode with it
    (sample b of seed s is the same text at --num_samples=1, 2, ... and in the server)."""
    return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, row), i))


def sample(logits_BV, keys_B2, temperature, top_k, top_p):
    """One token per row, row b with its key data keys_B2[b]; the knobs are one for the batch
    (`sampling.sample`) or one per row (`sampling.sample_rows`): the same token either way."""
    if jnp.ndim(temperature) == 0:
        return sampling.sample(logits_BV, keys_B2, temperature, top_k, top_p)
    return sampling.sample_rows(logits_BV, keys_B2, temperature, top_k, top_p)


def prefill(config: ModelConfig, params, cache, tokens_BT, start_B, last, keys_B2, knobs):
    """Writes T tokens per row at slots 0 .. T-1 (positions from each row's first real token)
    and samples each row's next token from the logits of its token `last` (one index for all
    rows, or one per row): a prompt's last real token, or a re-prefill window's last.
    Returns (cache, token_B)."""
    logits_BTV, cache = forward(config, params, tokens_BT, cache, 0, start_B)
    if jnp.ndim(last) == 0:
        last_BV = jax.lax.dynamic_index_in_dim(logits_BTV, last, axis=1, keepdims=False)
    else:
        last_BV = jnp.take_along_axis(logits_BTV, last[:, None, None], axis=1)[:, 0]
    return cache, sample(last_BV, keys_B2, *knobs)


def next_token(config: ModelConfig, params, cache, token_B, index, start_B, keys_B2, knobs):
    """The decode step: writes token_B (not yet in the cache) at slot `index` and samples the
    token after it. Returns (cache, token_B)."""
    logits_B1V, cache = forward(config, params, token_B[:, None], cache, index, start_B)
    return cache, sample(logits_B1V[:, 0], keys_B2, *knobs)


def window_policy(config: ModelConfig) -> str:
    """How generation goes on once the cache is full: "roll" or "reprefill" (module doc)."""
    if config.position == "rope" and 0 < config.sliding_window < config.max_seq_len:
        return "roll"
    return "reprefill"


def keep_length(max_seq_len: int) -> int:
    """W: how many of the most recent tokens a re-prefill keeps."""
    return max(1, max_seq_len // 2)


def reprefill_window(history_BS, token_B, start_B):
    """The S slots are full ("reprefill"): the tokens to prefill again, [B, W] (the last W - 1
    written ones and token_B, not yet written), and where each row's real tokens now start
    (its content moved S - W + 1 slots left). On device arrays (decode's loop) or on the
    host's numpy arrays (the server keeps each row's history there)."""
    S = history_BS.shape[1]
    shift = S - keep_length(S) + 1
    xp = np if isinstance(history_BS, np.ndarray) else jnp
    tokens_BW = xp.concatenate([history_BS[:, shift:], token_B[:, None]], axis=1)
    return tokens_BW, slide_start(start_B, shift)


def slide_start(start_B, shift: int):
    """Where each row's real tokens start once the cache's content moves `shift` slots left
    (its positions then count from there: a re-prefill restarts them)."""
    return (np if isinstance(start_B, np.ndarray) else jnp).maximum(start_B - shift, 0)

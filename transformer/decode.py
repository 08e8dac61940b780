"""Generation: one prefill pass over the prompts, then a `lax.scan` that emits one token per step.

    cache  = zeros [B·G, S, K] per layer              preallocated, fixed shape (G K/V heads)
    logits = model(prompts, cache)                       prefill: write the whole prompt
    repeat max_new_tokens - 1 times (lax.scan):
      token  = sample(logits[:, -1])                     greedy / temperature / top-k / top-p
      logits = model(token, cache at slot P + i)          attend to the filled slots only

Prompts of different lengths are left-padded to a shared length P, so every row writes its
next token to the same slot; each row's mask hides its padding slots and its positions
count from its first real token. P is rounded up to a bucket (16, 32, 64, ...), so a handful
of compiled programs serve every prompt. The loop is split into a few scans whose cache is
cut to the slots that can be filled by then (16, 32, 64, ... of them, `segments`), so early
tokens do not read the empty end of the cache. Temperature, top-k, top-p, the key, the prompt
content and the end token are traced arguments: changing them never recompiles.

On a device mesh (`generate(..., mesh=, rules=)`) the same program is compiled with explicit
shardings: parameters as in training, the KV cache split over batch rows and heads, the
prompts and the returned tokens copied on every device.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer import kernels, kvcache, sampling, sharding
from transformer.config import ModelConfig
from transformer.model import GPT, unstack_layers

PAD_ID = 0
MIN_BUCKET = 16


class PromptError(ValueError):
    """A prompt that cannot be generated from (empty, or too long for the context)."""


def prompt_bucket(longest: int, max_new_tokens: int, max_seq_len: int) -> int:
    """The padded prompt length: the next power of two >= longest (at least 16), capped so
    that the prompt and the new tokens fit in the context."""
    bucket = MIN_BUCKET
    while bucket < longest:
        bucket *= 2
    return min(bucket, max_seq_len - max_new_tokens + 1)


def check_prompts(prompts, max_new_tokens: int, max_seq_len: int) -> None:
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise PromptError(f"prompt {i} is empty: give at least one token")
        if len(prompt) >= max_seq_len:
            raise PromptError(f"prompt {i} has {len(prompt)} tokens but the context holds "
                              f"{max_seq_len}: shorten the prompt")
        if len(prompt) + max_new_tokens > max_seq_len:
            raise PromptError(
                f"prompt {i} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                f"that exceeds the context of {max_seq_len} tokens: shorten the prompt or "
                f"ask for at most {max_seq_len - len(prompt)} new tokens")


def segments(P: int, max_new_tokens: int, S: int) -> list[tuple[int, int, int]]:
    """The decode loop in pieces (first, stop, length): steps first .. stop-1 (which write
    slots P+first .. P+stop-1) run with the cache cut to its first `length` slots, a power of
    two (or S). Attention then reads at most about twice the filled slots, not all S."""
    out, i = [], 0
    while i < max_new_tokens - 1:
        length = MIN_BUCKET
        while length < P + i + 1:
            length *= 2
        length = min(length, S)
        stop = min(max_new_tokens - 1, length - P)
        out.append((i, stop, length))
        i = stop
    return out


def _forward(config: ModelConfig, params, tokens_BT, cache, index, start_B):
    """The one function decoding needs from the model: tokens + cache → logits + cache."""
    T = tokens_BT.shape[1]
    positions_BT = jnp.maximum(index + jnp.arange(T)[None, :] - start_B[:, None], 0)
    return GPT(config).apply({"params": params}, tokens_BT, positions_BT,
                             cache=cache, index=index, start_B=start_B)


def _generate_tokens(params, cache, prompt_BP, start_B, key, temperature, top_k, top_p, eos_id,
                    *, config: ModelConfig, max_new_tokens: int):
    """The compiled program: prefill + the decode scans. Returns (tokens_BN, cache).

    prompt_BP is left-padded; start_B[b] is the slot of row b's first real token. Tokens after
    a row's first `eos_id` are PAD_ID. The cache argument is donated and returned updated.
    """
    config = dataclasses.replace(config, scan_layers=False)
    params = unstack_layers(params, config.n_layers)  # once, outside the loop
    B, P = prompt_BP.shape
    config, params = kernels.decode_setup(config, params, B)  # bf16 kernels, or not

    # One key per token, split before the loop. Inside it they become counter-based
    # (`unsafe_rbg`) keys: XLA-CPU lowers threefry to a while loop, and a loop nested in the
    # scan body made XLA copy every layer's cache on every step.
    step_keys_N2 = jax.random.key_data(jax.random.split(key, max_new_tokens))

    def sample(logits_BV, i):
        step_key = jax.random.wrap_key_data(jnp.tile(step_keys_N2[i], 2), impl="unsafe_rbg")
        return sampling.sample(logits_BV, step_key, temperature, top_k, top_p)

    logits_BPV, cache = _forward(config, params, prompt_BP, cache, 0, start_B)
    token_B = sample(logits_BPV[:, -1], 0)
    done_B = token_B == eos_id

    def step(carry, i):
        cache, token_B, done_B = carry
        logits_B1V, cache = _forward(config, params, token_B[:, None], cache, P + i, start_B)
        token_B = jnp.where(done_B, PAD_ID, sample(logits_B1V[:, 0], i + 1))
        done_B = done_B | (token_B == eos_id)
        return (cache, token_B, done_B), token_B

    # One scan per cache length (16, 32, 64, ... slots): a step reads only the slots that can
    # be filled by then. Each piece is compiled once, inside this one program.
    carry, rest = (cache, token_B, done_B), []
    for first, stop, length in segments(P, max_new_tokens, config.max_seq_len):
        carry = (kvcache.prefix(carry[0], length),) + carry[1:]
        carry, tokens_NB = jax.lax.scan(step, carry, jnp.arange(first, stop))
        rest.append(tokens_NB)
    cache = kvcache.prefix(carry[0], config.max_seq_len)
    rest_NB = jnp.concatenate(rest) if rest else jnp.zeros((0, B), jnp.int32)
    tokens_BN = jnp.concatenate([token_B[:, None], rest_NB.T], axis=1)
    return tokens_BN, cache


generate_tokens = jax.jit(_generate_tokens, static_argnames=("config", "max_new_tokens"),
                          donate_argnames=("cache",))


@functools.lru_cache(maxsize=16)
def sharded_program(config: ModelConfig, max_new_tokens: int, mesh, rules, batch: int):
    """(generate, new_cache, param_shardings) compiled for `batch` rows on `mesh`.

    generate takes the arguments of `generate_tokens`, except the key as raw key data; all
    but params and cache are replicated. A batch the batch axes cannot split evenly (one
    prompt on eight devices) is not split; the heads still are.
    """
    rules = sharding.decode_rules(rules, mesh, batch)
    param_sh = sharding.param_shardings(config, mesh, rules)
    cache_sh = sharding.cache_shardings(config, mesh, rules)
    rep = sharding.replicated(mesh)

    def program(params, cache, prompt_BP, start_B, key_data, temperature, top_k, top_p, eos_id):
        return _generate_tokens(params, cache, prompt_BP, start_B,
                                jax.random.wrap_key_data(key_data), temperature, top_k, top_p,
                                eos_id, config=config, max_new_tokens=max_new_tokens)

    generate_fn = jax.jit(sharding.constrained(program, mesh, rules),
                          in_shardings=(param_sh, cache_sh) + (rep,) * 7,
                          out_shardings=(rep, cache_sh), donate_argnums=1)
    empty = functools.partial(kvcache.init_cache, batch, config.n_layers, config.kv_heads,
                              config.max_seq_len, config.head_dim, jnp.dtype(config.dtype))
    cache_fn = jax.jit(empty, out_shardings=cache_sh)
    return generate_fn, cache_fn, param_sh


@functools.partial(jax.jit, static_argnames=("config", "batch"))
def new_cache(*, config: ModelConfig, batch: int):
    return kvcache.init_cache(batch, config.n_layers, config.kv_heads, config.max_seq_len,
                              config.head_dim, jnp.dtype(config.dtype))


def generate(config: ModelConfig, params, prompts: list[list[int]], *, max_new_tokens: int,
             seed: int = 0, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int = -1, mesh=None, rules=None) -> list[list[int]]:
    """Continues each prompt (a list of token ids) by up to max_new_tokens tokens.

    Returns the new tokens of each prompt, cut before its first `eos_id` (-1: no end token).
    With `mesh` and `rules` (sharding.py) it decodes on that mesh; every process of a
    multi-host run must call it with the same prompts, and every one gets the tokens.
    """
    check_prompts(prompts, max_new_tokens, config.max_seq_len)
    P = prompt_bucket(max(map(len, prompts)), max_new_tokens, config.max_seq_len)
    prompt_BP = np.full((len(prompts), P), PAD_ID, np.int32)
    start_B = np.array([P - len(p) for p in prompts], np.int32)
    for row, prompt in enumerate(prompts):
        prompt_BP[row, P - len(prompt):] = prompt
    if mesh is None:
        tokens_BN, _ = generate_tokens(
            params, new_cache(config=config, batch=len(prompts)), prompt_BP, start_B,
            jax.random.key(seed), jnp.float32(temperature), jnp.int32(top_k),
            jnp.float32(top_p), jnp.int32(eos_id), config=config, max_new_tokens=max_new_tokens)
    else:
        generate_fn, cache_fn, param_sh = sharded_program(config, max_new_tokens, mesh,
                                                          tuple(rules), len(prompts))
        put = functools.partial(sharding.put_replicated, mesh=mesh)
        key_data = jax.device_get(jax.random.key_data(jax.random.key(seed)))
        tokens_BN, _ = generate_fn(
            jax.device_put(params, param_sh), cache_fn(), put(prompt_BP), put(start_B),
            put(key_data), put(np.float32(temperature)), put(np.int32(top_k)),
            put(np.float32(top_p)), put(np.int32(eos_id)))
    out = []
    for row in np.asarray(tokens_BN).tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out

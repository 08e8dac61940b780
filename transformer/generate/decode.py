"""Generation: one prefill pass over the prompts, then compiled loops that emit one token a step.

    cache  = zeros [B·G, S, K] per layer              preallocated, fixed shape (G K/V heads)
    logits = model(prompts, cache)                       prefill: write the whole prompt
    while fewer than max_new_tokens tokens and some row has not ended (lax.while_loop):
      token  = sample(logits[:, -1], row b's key = fold_in(fold_in(seed key, b), step))
      logits = model(token, cache at the next slot)      attend to the filled slots only
      when every slot is filled: the window policy below

Prompts of different lengths are left-padded to a shared length P, so every row writes its
next token to the same slot; each row's mask hides its padding slots and its positions count
from its first real token. The padding every row has (from the longest prompt, L tokens, up
to the bucket) goes to the block's right end, where decoding overwrites it: the first new
token takes slot L, and a bucket never fills the cache early. P is rounded up to a bucket
(16, 32, 64, ..., S), and so is the token budget (the output buffer: 16, 32, 64, ...
tokens); the number of tokens asked for is a traced argument, so a handful of compiled
programs serve every prompt and every length. While the cache fills, the loop runs in pieces
whose cache is cut to the slots that can be filled by then (128, 256, 512, ... of them,
`fill_segments`; the last piece of a request that stops short of the context at the slots it
can write), so early tokens do not read the empty end of the cache. Temperature, top-k,
top-p, the key, the prompt content, the length and the end token are traced arguments:
changing them never recompiles. A row that samples its end token writes PAD_ID from then on;
the loop stops when every row has ended.

The loops are `lax.while_loop`s, the form of `lax.scan` whose trip count is traced: a scan
runs a fixed number of steps, so it would compile one program per requested length and
could not stop when every row has sampled its end token. Each loop body is one decode step,
compiled once; no Python runs per token.

Generation is not capped by the context S = max_seq_len. Once all S slots are filled, it
goes on from the most recent tokens, by one of two policies (`window_policy`):

- "reprefill" (learned positions; RoPE with full attention): the last W = S/2 tokens are
  prefilled again into slots 0 .. W-1 with positions restarting at 0, and decoding goes on
  into the freed slots. Learned positions stay inside their table, and every context the
  model sees starts at a token it treats as a sequence start, as in training (a model
  trained with full attention leans on the first tokens; a rolling window that evicts them
  degrades it). The re-prefill, W tokens in one pass, is paid once every S - W + 1 tokens.
  Rows of one batch slide together, at the same slot: a short prompt batched with a longer
  one (a larger left padding) slides a few tokens earlier than it would alone.
- "roll" (RoPE with a sliding window w < S): the cache is a ring; token n goes to slot
  n mod S and positions keep counting. RoPE scores depend on p - s only and no query looks
  back more than w < S positions, so this is exactly the model's forward pass over the
  whole text, however long: nothing is recomputed and nothing is approximated.

A prompt longer than the context continues from its last S tokens.

What one step does (the model call, the keys, the sampling, the re-prefill's window) is
step.py's, which the server's continuous batching (slots.py) runs too; this module is the
driver for one batch: buckets, the compiled loops, streaming, chunks, groups and meshes.

On a device mesh (`generate(..., mesh=, rules=)`) the same program is compiled with explicit
shardings: parameters as in training, the KV cache split over batch rows and heads, the
prompts and the returned tokens copied on every device.

On one CPU device a small model's batch runs as several programs at once (`decode_groups`,
`row_groups`): groups of rows, each its own cache and thread, with the keys and
layout of one program of all the rows (its tokens in float32; in bfloat16 matmuls a group
rounds as a program of its own row count: docs/sampling.md, "Within rounding"). XLA-CPU
leaves cores idle in such a model's decode step.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from transformer import host
from transformer.config import INT32_MAX, ModelConfig, check_sampling
from transformer.generate import step
from transformer.generate.interrupt import InterruptBetweenChunks
from transformer.generate.step import (MAX_SEED, MIN_BUCKET, PAD_ID, STREAM_EVERY, bucket,
                                       keep_length, new_cache, prompt_bucket, window_policy)
from transformer.model import flops, kernels, kvcache
from transformer.parallel import sharding

# While the cache fills, a cache of up to this many slots is read whole: each shorter piece
# is one more copy of the decode step to compile (for the quick start's 128-slot model, the
# pieces of 32 and 64 slots cost ~1.4 s of its sample's ~4 s compile on a CPU), and what it
# saves is attention over a few dozen slots. At the bench's shape (512 slots, a 2-vCPU AMX
# Xeon) 128 kept batch-8 decoding within 2-4% of pieces from 16 (6,029 against 6,112-6,251
# tokens/s) and compiles ~25% less; 256 lost 13-17% (5,206-5,370).
MIN_SEGMENT = 128


# What one call takes per row and token of its budget: the token (int32) and its key data
# (2 x uint32), made before the loop, 12 bytes; the process's peak grew by 1.5-1.8x that
# (1 row x 2**24 tokens, 8 rows x 2**22; 2-vCPU AMD EPYC Zen 5), so twice it is counted.
BYTES_PER_TOKEN = 24


class GenerationError(ValueError):
    """Arguments `generate` cannot work with (a length, a sampling knob, the prompt list)."""


class PromptError(GenerationError):
    """A prompt that cannot be generated from (empty, or holding ids outside the vocabulary)."""


def _bucket_below(P: int) -> int:
    """The largest prompt bucket below P (0 below the first): a prompt that P holds is
    longer than it."""
    below, size = 0, MIN_BUCKET
    while size < P:
        below, size = size, size * 2
    return below


def token_budget(max_new_tokens: int, room: int | None = None) -> int:
    """The output buffer's length: the next power of two >= max_new_tokens (at least 16); or
    `room` (the context's slots after the padded prompt, S - P) when the request fits there
    and that power of two does not: then the program has no window loop to compile (the
    cache cannot fill), e.g. the quick start's 100-token sample after a 16-slot prompt."""
    budget = min(bucket(max_new_tokens), INT32_MAX)  # the device counts steps in int32
    if room is not None and max_new_tokens <= room < budget:
        return room
    return budget


def fill_segments(P: int, S: int, end: int | None = None) -> list[tuple[int, int]]:
    """The loop while the cache fills, in pieces (first, length): the steps that write slots
    first .. length-1 run with the cache cut to its first `length` slots, a power of two
    (or S), at least MIN_SEGMENT. Attention then reads at most about twice the filled slots
    (or MIN_SEGMENT), not all S. `end` (default S): the slots the program can write at all;
    a program whose budget stops short of the context writes slots < P + budget - 1 only, and
    its last piece is cut to `end` rounded up to MIN_BUCKET slots, not to the next power of
    two: the bench's 256 tokens after a 16-token prompt (512 slots) read 272 slots in their
    last 16 steps, not 512."""
    end = S if end is None else min(S, -(-end // MIN_BUCKET) * MIN_BUCKET)
    out, slot = [], P
    while slot < end:
        length = min(max(bucket(slot + 1, S), MIN_SEGMENT), end)
        out.append((slot, length))
        slot = length
    return out


def check_args(config: ModelConfig, prompts, max_new_tokens, temperature, top_k, top_p,
               eos_id) -> None:
    """Refuses what generation cannot mean, naming the argument and the fix."""
    check_sampling(temperature, top_k, top_p, max_new_tokens, error=GenerationError)
    if not (eos_id == -1 or 0 <= eos_id < config.vocab_size):
        raise GenerationError(f"eos_id={eos_id}: must be -1 (no end token) or a token id "
                              f"below the vocabulary size {config.vocab_size}")
    if len(prompts) == 0:
        raise PromptError("no prompts: give a list of at least one prompt")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise PromptError(f"prompt {i} is empty: give at least one token")
        bad = [t for t in prompt if not 0 <= t < config.vocab_size]
        if bad:
            raise PromptError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary "
                              f"[0, {config.vocab_size})")


class _State(NamedTuple):
    cache: list            # per layer {'k', 'v'}: [B·G, S or a prefix, K]
    token_B: jax.Array     # the last token sampled, not yet in the cache
    done_B: jax.Array      # the row has sampled its end token
    out_BN: jax.Array      # the tokens sampled so far (the rest PAD_ID)
    i: jax.Array           # how many tokens have been sampled
    index: jax.Array       # the slot token_B goes to (counted from the text's start)
    start_B: jax.Array     # each row's first real slot
    history_BS: jax.Array  # the token in each cache slot (what a re-prefill reads)


class _Loop(NamedTuple):
    """What every step of one compiled generation shares (traced arrays and static facts)."""
    config: ModelConfig
    params: dict
    keys_NB2: jax.Array    # step i's key data for row b: fold_in(fold_in(seed key, b), i)
    knobs: tuple           # temperature, top_k, top_p, eos_id
    n: jax.Array           # how many tokens were asked for (<= budget)
    stream_id: jax.Array | None  # None: no streaming
    budget: int

    def running(self, state: _State):
        return (state.i < self.n) & ~jnp.all(state.done_B)

    def emit(self, state: _State, token_B) -> _State:
        """Records token_B (sampled with key i) as token i."""
        eos_id = self.knobs[3]
        token_B = jnp.where(state.done_B, PAD_ID, token_B)
        done_B = state.done_B | (token_B == eos_id)
        out_BN = jax.lax.dynamic_update_slice(state.out_BN, token_B[:, None], (0, state.i))
        state = state._replace(token_B=token_B, done_B=done_B, out_BN=out_BN, i=state.i + 1)
        if self.stream_id is not None:  # a chunk to the host every STREAM_EVERY tokens;
            # the host answers which rows to end: those whose text reached a stop string, or
            # every row once the caller said stop (a client that went away)
            ended_B = jax.lax.cond(state.i % STREAM_EVERY == 0, self.send,
                                   lambda s: jnp.zeros_like(s.done_B), state)
            state = state._replace(done_B=state.done_B | ended_B)
        return state

    def send(self, state: _State) -> jax.Array:
        """Hands the host the last STREAM_EVERY columns of the output (`_deliver`), or all of
        them when the budget is shorter (the room left after a prompt, `token_budget`);
        returns the rows the host ends."""
        K = min(STREAM_EVERY, self.budget)
        first = jnp.clip(state.i - K, 0, self.budget - K)
        chunk_BK = jax.lax.dynamic_slice_in_dim(state.out_BN, first, K, axis=1)
        return io_callback(_deliver, jax.ShapeDtypeStruct(state.done_B.shape, jnp.bool_),
                           self.stream_id, first, state.i, chunk_BK, ordered=True)

    def step(self, state: _State) -> _State:
        """Writes the last token into the cache and samples the next one."""
        cache, token_B = step.next_token(self.config, self.params, state.cache, state.token_B,
                                         state.index, state.start_B, self.keys_NB2[state.i],
                                         self.knobs[:3])
        history_BS = state.history_BS
        if window_policy(self.config) == "reprefill":  # a ring ("roll") never re-reads tokens
            history_BS = jax.lax.dynamic_update_slice(history_BS, state.token_B[:, None],
                                                      (0, state.index))
        state = state._replace(cache=cache, index=state.index + 1, history_BS=history_BS)
        return self.emit(state, token_B)

    def reprefill(self, state: _State) -> _State:
        """The cache is full: the last W tokens (the unwritten one included) into slots
        0 .. W-1, positions from 0, and the next token from the last one's logits."""
        W = keep_length(self.config.max_seq_len)
        tokens_BW, start_B = step.reprefill_window(state.history_BS, state.token_B,
                                                   state.start_B)
        cache, token_B = step.prefill(self.config, self.params, state.cache, tokens_BW, start_B,
                                      W - 1, self.keys_NB2[state.i], self.knobs[:3])
        history_BS = jax.lax.dynamic_update_slice(state.history_BS, tokens_BW, (0, 0))
        state = state._replace(cache=cache, index=jnp.int32(W), start_B=start_B,
                               history_BS=history_BS)
        return self.emit(state, token_B)

    def fill(self, state: _State, P: int) -> _State:
        """While the cache fills: one loop per cache length (128, 256, 512, ... slots), so a
        step reads only the slots that can be filled by then. Each is compiled once. Token
        i is sampled after slot L + i - 1 is written (L <= P: the longest prompt's length):
        a budget that stops short of the context writes no slot from P + budget - 1 on."""
        S = self.config.max_seq_len
        # The first new token's slot is the longest prompt's length (its padding to the
        # bucket moved out of the cache, _generate_tokens): above the bucket below P.
        for _, length in fill_segments(_bucket_below(P), S, P + self.budget - 1):
            state = state._replace(cache=kvcache.prefix(state.cache, length))
            state = jax.lax.while_loop(
                lambda s, length=length: self.running(s) & (s.index < length), self.step, state)
        return state._replace(cache=kvcache.prefix(state.cache, S))

    def slide(self, state: _State) -> _State:
        """The cache is full (or generation is over): the window policy's loop."""
        if window_policy(self.config) == "roll":
            return jax.lax.while_loop(self.running, self.step, state)
        S = self.config.max_seq_len

        def cycle(state):
            state = self.reprefill(state)
            return jax.lax.while_loop(lambda s: self.running(s) & (s.index < S), self.step,
                                      state)
        return jax.lax.while_loop(self.running, cycle, state)


def _step_keys(key, first, budget: int, rows_B):
    """Key data of steps first .. first+budget-1 for the rows numbered rows_B: [budget, B, 2]."""
    return jax.vmap(lambda i: jax.vmap(lambda b: step.token_key(key, b, first + i))(rows_B))(
        jnp.arange(budget))


class _Carry(NamedTuple):
    """What one chunk of a long generation hands the next: a _State without its output."""
    cache: list
    token_B: jax.Array
    done_B: jax.Array
    index: jax.Array
    start_B: jax.Array
    history_BS: jax.Array


def _carry(state: _State) -> _Carry:
    return _Carry(state.cache, state.token_B, state.done_B, state.index, state.start_B,
                  state.history_BS)


def _generate_tokens(params, cache, prompt_BP, start_B, key, temperature, top_k, top_p, eos_id,
                     n, stream_id, first_row, common, *, config: ModelConfig, budget: int,
                     stream: bool = False, carry: bool = False):
    """The compiled program: prefill, the fill loops, then the window policy's loop.
    Returns (tokens_BN, cache) with N = budget; only the first n columns are sampled.

    prompt_BP is left-padded; start_B[b] is the slot of row b's first real token. The cache
    argument is donated and returned updated. With `stream`, every sampled token is handed
    to the host as it is made (`_deliver`). The rows are rows first_row .. first_row+B-1 of
    a batch whose every row has `common` columns of left padding (its smallest start_B):
    decoded with that batch's keys and layout, a group of rows (`decode_groups`) makes the
    tokens the whole batch makes, up to the rounding of its own batch size.
    """
    B, P = prompt_BP.shape
    config, params = step.setup(config, params, B)  # once, outside the loop
    # Row b's key at step i is step.token_key(key, b, i), for every step before the loops;
    # there the noise is sampling.gumbel_rows' unrolled threefry: XLA-CPU lowers
    # jax.random's threefry to a while loop, and a loop nested in the decode body made XLA
    # copy every layer's cache on every step.
    keys_NB2 = _step_keys(key, 0, budget, first_row + jnp.arange(B))
    loop = _Loop(config, params, keys_NB2, (temperature, top_k, top_p, eos_id), n,
                 stream_id if stream else None, budget)

    # The padding every row of the batch has (`common` columns, from its longest prompt up
    # to the bucket P) moves to the right end, where decoding overwrites it before any query
    # can see it: it takes no cache slot. Left in place it filled the cache early: a 67-token prompt (bucket 128) on a
    # 128-slot model re-prefilled after its first token, dropping prompt tokens the context
    # holds, so greedy text differed from transformers' on the same weights from token 1.
    prompt_BP, start_B = jnp.roll(prompt_BP, -common, axis=1), start_B - common
    first = jnp.int32(P) - common  # the slot of the first new token
    cache, token_B = step.prefill(config, params, cache, prompt_BP, start_B, first - 1,
                                  keys_NB2[0], loop.knobs[:3])
    history_BS = jnp.zeros((B, config.max_seq_len), jnp.int32).at[:, :P].set(prompt_BP)
    state = _State(cache, jnp.zeros(B, jnp.int32), jnp.zeros(B, bool),
                   jnp.full((B, budget), PAD_ID, jnp.int32), jnp.int32(0), first,
                   start_B, history_BS)
    state = loop.fill(loop.emit(state, token_B), P)
    if P + budget > config.max_seq_len:
        # Otherwise the cache never fills: the budget's steps write at most slots P ..
        # P + budget - 2. Leaving the window policy's loop out of such a program halves the
        # model copies XLA compiles (prefill and fill steps, no re-prefill and its loop).
        state = loop.slide(state)
    if stream:
        loop.send(state)  # the last, partial chunk
    return state.out_BN, (_carry(state) if carry else state.cache)


_program = jax.jit(_generate_tokens, static_argnames=("config", "budget", "stream", "carry"),
                   donate_argnames=("cache",))


def _continue_tokens(params, carry: _Carry, key, first, temperature, top_k, top_p, eos_id, n,
                     stream_id, *, config: ModelConfig, budget: int, stream: bool = False):
    """The next chunk of a long generation: n more tokens (steps first .. first+n-1, whose
    keys they are) from `carry`, whose cache is full (the first chunk ran at least S steps).
    Returns (tokens_BN of this chunk, the carry for the next one)."""
    B = carry.token_B.shape[0]
    config, params = step.setup(config, params, B)
    loop = _Loop(config, params, _step_keys(key, first, budget, jnp.arange(B)),
                 (temperature, top_k, top_p, eos_id), n, stream_id if stream else None, budget)
    state = _State(carry.cache, carry.token_B, carry.done_B,
                   jnp.full((B, budget), PAD_ID, jnp.int32), jnp.int32(0), carry.index,
                   carry.start_B, carry.history_BS)
    if window_policy(config) == "reprefill":  # finish the re-prefill cycle under way
        S = config.max_seq_len
        state = jax.lax.while_loop(lambda s: loop.running(s) & (s.index < S), loop.step, state)
    state = loop.slide(state)
    if stream:
        loop.send(state)
    return state.out_BN, _carry(state)


_continued = jax.jit(_continue_tokens, static_argnames=("config", "budget", "stream"),
                     donate_argnames=("carry",))

# A long streamed generation runs as device calls of CHUNK tokens (at least the context),
# each continuing the last (`_Carry`: cache, last token, positions; the keys follow the step
# count): its memory does not grow with the length, and Ctrl-C, which Python delivers only
# between device calls, stops it within a chunk. Shorter or unstreamed generations are one
# call, as before.
CHUNK = 4096

# Streaming: the compiled program calls `_deliver` with its stream id and the last
# STREAM_EVERY tokens (step.py), every STREAM_EVERY tokens; `generate` registers the caller's
# function under a fresh id for the length of one call. The id is a traced argument, so every
# streaming call shares one compiled program.
_SINKS: dict[int, object] = {}
_SINK_IDS = itertools.count(1)


def _deliver(stream_id, first, made, tokens_BK):
    """tokens_BK holds tokens first .. first+K-1; those from `made` on are not sampled yet.
    Returns the rows the caller's on_tokens ended."""
    sink = _SINKS.get(int(stream_id))
    if sink is None:
        return np.zeros(tokens_BK.shape[0], bool)
    return sink(int(first), int(made), np.asarray(tokens_BK))


class _Stream:
    """Turns chunks (which may overlap) into one on_tokens(i, tokens_B, done_B) call per step,
    and remembers where on_tokens ended a row (`ended_at`: its last token's step)."""

    def __init__(self, on_tokens, batch: int, eos_id: int):
        self.on_tokens, self.eos_id = on_tokens, eos_id
        self.next, self.done_B, self.stopped = 0, np.zeros(batch, bool), False
        self.ended_at: dict[int, int] = {}

    def __call__(self, first, made, tokens_BK):
        """The rows that have ended (all of them once on_tokens said stop)."""
        if self.stopped:
            return np.ones_like(self.done_B)
        for i in range(max(first, self.next), made):
            token_B = tokens_BK[:, i - first]
            self.done_B = self.done_B | (token_B == self.eos_id)
            ended = self.on_tokens(i, token_B, self.done_B.copy())
            if ended is False:  # stop generating: every row ends here
                ended = np.ones_like(self.done_B)
                self.stopped = True
            if ended is not None and ended is not True:
                for b in np.flatnonzero(np.asarray(ended, bool) & ~self.done_B):
                    self.ended_at[int(b)] = i
                self.done_B = self.done_B | np.asarray(ended, bool)
            if self.stopped:
                return self.done_B.copy()
        self.next = max(self.next, made)
        return self.done_B.copy()


def generate_tokens(params, cache, prompt_BP, start_B, key, temperature, top_k, top_p, eos_id,
                    *, config: ModelConfig, max_new_tokens: int):
    """The compiled program for max_new_tokens tokens, on arrays: (tokens_BN, cache)."""
    tokens_BN, cache = _program(params, cache, prompt_BP, start_B, key, temperature, top_k,
                                top_p, eos_id, jnp.int32(max_new_tokens), jnp.int32(0),
                                jnp.int32(0), jnp.min(start_B), config=config,
                                budget=token_budget(max_new_tokens))
    if tokens_BN.shape[1] != max_new_tokens:  # a budget bucket above the request
        tokens_BN = tokens_BN[:, :max_new_tokens]
    return tokens_BN, cache


@functools.lru_cache(maxsize=16)
def sharded_program(config: ModelConfig, budget: int, mesh, rules, batch: int):
    """(generate, new_cache, param_shardings) compiled for `batch` rows on `mesh`.

    generate takes the arguments of `_program` up to n (no stream id), except the key as raw
    key data; all but params and cache are replicated. The params come in as trained (split
    over fsdp and tensor: param_shardings) and are gathered over fsdp once, at the program's
    top (`sharding.decode_rules`), not at every token. A batch the batch axes cannot split
    evenly (one prompt on eight devices) is not split; the heads still are.
    """
    param_sh = sharding.param_shardings(config, mesh, rules)  # as trained (split over fsdp)
    rules = sharding.decode_rules(rules, mesh, batch)
    gathered_sh = sharding.param_shardings(config, mesh, rules)
    cache_sh = sharding.cache_shardings(config, mesh, rules)
    rep = sharding.replicated(mesh)

    def program(params, cache, prompt_BP, start_B, key_data, temperature, top_k, top_p, eos_id,
                n):
        # Gathered here, once a call: left split over fsdp, the weights are loop inputs and
        # XLA gathers every one of them inside the loop, at every token.
        params = jax.lax.with_sharding_constraint(params, gathered_sh)
        return _generate_tokens(params, cache, prompt_BP, start_B,
                                jax.random.wrap_key_data(key_data), temperature, top_k, top_p,
                                eos_id, n, jnp.int32(0), jnp.int32(0), jnp.min(start_B),
                                config=config, budget=budget)

    generate_fn = jax.jit(sharding.constrained(program, mesh, rules),
                          in_shardings=(param_sh, cache_sh) + (rep,) * 8,
                          out_shardings=(rep, cache_sh), donate_argnums=1)
    empty = functools.partial(kvcache.init_cache, batch, config.n_layers, config.kv_heads,
                              config.max_seq_len, config.head_dim, jnp.dtype(config.dtype),
                              config.d_model * config.smear)
    cache_fn = jax.jit(empty, out_shardings=cache_sh)
    return generate_fn, cache_fn, param_sh


def new_caches(*, config: ModelConfig, batch: int, groups: int) -> list:
    """One empty cache per group of -(-batch // groups) rows (`decode_groups`)."""
    return [new_cache(config=config, batch=-(-batch // groups)) for _ in range(groups)]


# Decoding a small model leaves CPU cores idle: XLA-CPU runs a decode step's small dots and
# fusions one after another, on ~1.4 of 2 cores at the bench's shape, batch 8. The same rows
# as two programs of half the rows, each called from its own thread, keep both cores busy
# (the CPU client runs them at once): 1.2-1.6x the tokens/s at batch 8 and 1.5x at 16 on a
# 2-vCPU AMD EPYC Zen 5 (32 MB L3). Each program reads all the weights every step, so for a
# model whose weights do not stay in the cache the groups lose: d_model 384 (14 MB of bf16
# weights) gained 1.13x, 512 (25 MB) lost 0.95x, GPT-2 small lost 0.67x, where one program
# already keeps ~1.7 cores busy with its larger dots.
SMALL_WEIGHTS_FALLBACK = 16 * 2**20  # bytes: half of a common 32 MB L3, where sysfs is silent


def _small_weights() -> int:
    """Bytes of weights a decode step may read and still leave cores idle: half the L3."""
    l3 = host.l3_bytes()
    return l3 // 2 if l3 > 0 else SMALL_WEIGHTS_FALLBACK


def row_groups(config: ModelConfig, batch: int) -> int:
    """How many programs `generate` decodes `batch` rows in at once: on a CPU, for a model
    whose weights (as decoding reads them) fit in half the last-level cache, one per core
    this process may use, up to one per row; otherwise 1 (an accelerator, or a model big
    enough that one program's dots use the cores)."""
    if jax.default_backend() != "cpu" or batch < 2:
        return 1
    weight_bytes = flops.matmul_weights(config) * (
        2 if kernels.decode_matmul(config, batch) == "fast_bf16" else 4)
    if weight_bytes > _small_weights():
        return 1
    return whole_groups(batch, min(host.usable_cores(), batch))


def whole_groups(batch: int, groups: int) -> int:
    """The groups of ceil(batch / groups) rows that `batch` rows fill: none left holding only
    copies (5 rows in 4 groups would be 2 + 2 + 1 + 0 rows: 3 groups of 2)."""
    return -(-batch // -(-batch // groups))


def decode_groups(params, caches, prompt_BP, start_B, key, temperature, top_k, top_p, eos_id,
                  n, *, config: ModelConfig, budget: int) -> np.ndarray:
    """`_program` over len(caches) groups of R = ceil(B / G) rows at once, each called from a
    thread of its own; returns the tokens [B, budget] on the host. Where G does not divide
    B the last group is filled up with copies of the last row, whose tokens are dropped (3
    rows on 2 cores as 2 + 2: 1.2x the tokens/s of one 3-row program for the quick start's
    model). Group g's rows keep their keys (its first row's number is traced: one compiled
    program serves every group) and the batch's layout, so the tokens are the ones a single
    program gives in float32; in bfloat16 matmuls each group rounds as a program of its row
    count. The caches are donated."""
    prompt_BP, start_B = np.asarray(prompt_BP), np.asarray(start_B)  # cut on the host
    G, B = len(caches), prompt_BP.shape[0]
    R, common = -(-B // G), np.int32(start_B.min())
    fill = np.full(G * R - B, B - 1)  # the copies of the last row, at the end
    prompt_BP, start_B = (np.concatenate([x, x[fill]]) for x in (prompt_BP, start_B))

    def group(g):
        rows = slice(g * R, (g + 1) * R)
        tokens_RN, _ = _program(params, caches[g], prompt_BP[rows], start_B[rows], key,
                                temperature, top_k, top_p, eos_id, n, np.int32(0),
                                np.int32(g * R), common, config=config, budget=budget)
        # Waits for this group. block_until_ready raises a failed call's error (out of
        # memory); np.asarray on such an array aborted the process in XLA's buffer protocol.
        return np.asarray(jax.block_until_ready(tokens_RN))

    if G == 1:
        return group(0)
    with concurrent.futures.ThreadPoolExecutor(G - 1) as pool:
        others = [pool.submit(group, g) for g in range(1, G)]
        first = group(0)
        return np.concatenate([first] + [f.result() for f in others])[:B]


def precompile(config: ModelConfig, params, prompts: list[list[int]], *, max_new_tokens: int,
               mesh, rules) -> None:
    """Compiles the program that `generate(config, params, prompts, max_new_tokens=...,
    mesh=mesh, rules=rules)` runs, for any parameters shaped like `params` (arrays or
    jax.ShapeDtypeStruct) and any seed and sampling knobs: that call then finds it compiled
    (the same explicitly sharded program, from jit's cache). For a thread: train.py compiles
    its end-of-training sample while the run trains."""
    check_args(config, prompts, max_new_tokens, 1.0, 0, 1.0, -1)
    prompt_BP, start_B = left_pad(prompts, config.max_seq_len)
    budget = token_budget(max_new_tokens, config.max_seq_len - prompt_BP.shape[1])
    generate_fn, cache_fn, param_sh = sharded_program(config, budget, mesh, tuple(rules),
                                                      len(prompts))
    rep = sharding.replicated(mesh)

    def like(x, sh=rep):
        return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=sh)

    params = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          params, param_sh)
    cache = cache_fn.eval_shape()
    key_data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    knobs = (np.float32(0), np.int32(0), np.float32(0), np.int32(0), np.int32(0))
    cache_fn.lower().compile()
    generate_fn.lower(params, cache, like(prompt_BP), like(start_B),
                      jax.ShapeDtypeStruct(key_data.shape, key_data.dtype, sharding=rep),
                      *map(like, knobs)).compile()


def _available_memory() -> int | None:
    """Bytes this process can still take: on a CPU the host's (`host.available_memory`:
    MemAvailable, at most the cgroup's memory.max), on an accelerator its free memory. None
    where nothing is known."""
    if jax.default_backend() != "cpu":
        stats = jax.devices()[0].memory_stats() or {}
        if "bytes_limit" in stats:
            return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        return None
    return host.available_memory()


def check_buffers(batch: int, budget: int, max_new_tokens: int) -> None:
    """Refuses a generation whose one-call buffers (BYTES_PER_TOKEN per row and token of the
    budget) would not fit in the memory left: XLA's out-of-memory was a traceback, and from
    decode_groups' threads an abort. A streamed sample runs in chunks and never needs it."""
    need, available = batch * budget * BYTES_PER_TOKEN, _available_memory()
    if available is not None and need > available:
        raise GenerationError(
            f"max_new_tokens={max_new_tokens:,} for {batch} row(s) needs {need / 2**30:,.1f} "
            f"GiB of buffers at once and {available / 2**30:,.1f} GiB is free: ask for fewer "
            "tokens or samples, or stream one sample (sample.py does by default; it runs in "
            "chunks)")


def left_pad(prompts, max_seq_len: int):
    """(prompt_BP, start_B): the prompts' last max_seq_len tokens, left-padded to a bucket."""
    prompts = [list(p)[-max_seq_len:] for p in prompts]
    P = prompt_bucket(max(map(len, prompts)), max_seq_len)
    prompt_BP = np.full((len(prompts), P), PAD_ID, np.int32)
    start_B = np.array([P - len(p) for p in prompts], np.int32)
    for row, prompt in enumerate(prompts):
        prompt_BP[row, P - len(prompt):] = prompt
    return prompt_BP, start_B


def generate(config: ModelConfig, params, prompts: list[list[int]], *, max_new_tokens: int,
             seed: int = 0, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int = -1, mesh=None, rules=None, on_tokens=None,
             budget: int | None = None, groups: int | None = None) -> list[list[int]]:
    """Continues each prompt (a list of token ids) by up to max_new_tokens tokens, any number
    (past the context: the window policy, module doc). A prompt longer than the context
    continues from its last max_seq_len tokens.

    Returns the new tokens of each prompt, cut before its first `eos_id` (-1: no end token).
    `on_tokens(i, tokens_B, done_B)`, if given, is called on the host with every step's
    tokens, in order, in chunks of STREAM_EVERY steps as they are sampled (numpy arrays;
    done_B: the row has ended, this token is its end token or padding). on_tokens may return
    a bool per row: True ends that row after this token (a stop string its text reached), or
    False to end every row (a client that went away); the device stops within STREAM_EVERY
    tokens and each ended row's result ends at that token. `budget`: the output buffer's
    length, >= max_new_tokens (default: token_budget's, with the room after the prompt), the one static length of the
    program: a caller that fixes it (a server) serves every max_new_tokens up to it with one
    compiled program, with the same tokens (key i is fold_in(seed key, i) whatever the
    budget). With `mesh` and `rules` (sharding.py) it decodes on that mesh; every process of
    a multi-host run must call it with the same prompts, and every one gets the tokens.
    `groups`: decode the rows as that many programs at once (`decode_groups`; from 1 to the
    number of prompts); default `row_groups`'s choice for this machine. On a mesh or while
    streaming the batch is one program.
    Raises GenerationError (PromptError for a prompt) for bad arguments.
    """
    check_args(config, prompts, max_new_tokens, temperature, top_k, top_p, eos_id)
    if groups is not None and not 1 <= groups <= len(prompts):
        raise GenerationError(f"groups={groups}: must be from 1 to the {len(prompts)} prompts")
    prompt_BP, start_B = left_pad(prompts, config.max_seq_len)
    if budget is None:
        budget = token_budget(max_new_tokens, config.max_seq_len - prompt_BP.shape[1])
    elif budget < max_new_tokens:
        raise GenerationError(f"budget={budget}: must be >= max_new_tokens={max_new_tokens}")
    if not 0 <= seed <= MAX_SEED:
        # A JAX key holds 32 bits: 2**40 gave seed 0's text, 2**64 an OverflowError.
        raise GenerationError(f"seed={seed}: must be in [0, {MAX_SEED:,}] (the server's range "
                              "too); a larger seed would repeat a smaller one's text")
    key = jax.random.key(seed)
    knobs = (np.float32(temperature), np.int32(top_k), np.float32(top_p), np.int32(eos_id),
             np.int32(max_new_tokens))
    ended_at = {}
    if mesh is not None or on_tokens is None:  # one call holds the whole budget
        check_buffers(len(prompts), budget, max_new_tokens)
    if mesh is not None:
        if on_tokens is not None:
            raise GenerationError("on_tokens (streaming) decodes on one device: drop mesh")
        generate_fn, cache_fn, param_sh = sharded_program(config, budget, mesh, tuple(rules),
                                                          len(prompts))
        put = functools.partial(sharding.put_replicated, mesh=mesh)
        key_data = jax.device_get(jax.random.key_data(key))
        tokens_BN, _ = generate_fn(jax.device_put(params, param_sh), cache_fn(), put(prompt_BP),
                                   put(start_B), put(key_data), *map(put, knobs))
        tokens_BN = jax.block_until_ready(tokens_BN)  # a failed call raises (np.asarray aborts)
    elif on_tokens is not None and max_new_tokens > _chunk(config):
        tokens_BN = _generate_chunks(config, params, prompt_BP, start_B, key, knobs[:4],
                                     max_new_tokens, on_tokens, ended_at)
    elif on_tokens is not None:
        stream_id = next(_SINK_IDS)
        _SINKS[stream_id] = sink = _Stream(on_tokens, len(prompts), eos_id)
        ended_at = sink.ended_at
        try:
            tokens_BN, _ = _program(params, new_cache(config=config, batch=len(prompts)),
                                    prompt_BP, start_B, key, *knobs, np.int32(stream_id),
                                    np.int32(0), np.int32(start_B.min()), config=config,
                                    budget=budget, stream=True)
            tokens_BN = jax.block_until_ready(tokens_BN)
        finally:
            _SINKS.pop(stream_id, None)
    else:
        G = row_groups(config, len(prompts)) if groups is None else groups
        G = whole_groups(len(prompts), G)
        tokens_BN = decode_groups(params, new_caches(config=config, batch=len(prompts),
                                                     groups=G),
                                  prompt_BP, start_B, key, *knobs, config=config, budget=budget)
    out = []
    for b, row in enumerate(np.asarray(tokens_BN)[:, :max_new_tokens].tolist()):
        if b in ended_at:  # ended by on_tokens: its tokens up to that step (then padding)
            row = row[: ended_at[b] + 1]
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def _chunk(config: ModelConfig) -> int:
    """Tokens per device call of a long streamed generation: CHUNK, or the context if larger
    (the first call must fill the cache)."""
    return max(CHUNK, bucket(config.max_seq_len))


def _generate_chunks(config: ModelConfig, params, prompt_BP, start_B, key, knobs,
                     max_new_tokens: int, on_tokens, ended_at: dict):
    """`generate`'s streamed loop for a long request: chunk after chunk until max_new_tokens
    or every row has ended. The same tokens as one call (the same steps and keys). Ctrl-C
    raises KeyboardInterrupt after the chunk under way (its tokens streamed). Fills
    `ended_at` as one call's stream does: row -> the step at which on_tokens ended it.
    Memory: one chunk's buffers, plus 4 bytes per token and row for the returned tokens."""
    B, chunk, eos_id = prompt_BP.shape[0], _chunk(config), int(knobs[3])
    pieces, done_B, made, carry = [], np.zeros(B, bool), 0, None
    with InterruptBetweenChunks() as interrupt:
        while made < max_new_tokens and not done_B.all():
            interrupt.check()
            n = np.int32(min(chunk, max_new_tokens - made))
            out_BN, carry = _one_chunk(config, params, prompt_BP, start_B, key, knobs, n, made,
                                       carry, on_tokens, done_B, chunk, eos_id, ended_at)
            pieces.append(out_BN[:, :n])
            done_B = np.asarray(carry.done_B)
            made += int(n)
    return np.concatenate(pieces, axis=1)


def _one_chunk(config, params, prompt_BP, start_B, key, knobs, n, made, carry, on_tokens,
               done_B, chunk: int, eos_id: int, ended_at: dict):
    """One device call: the first chunk from the prompts, or the next from `carry`. Streams
    its steps to on_tokens as steps made .. made+n-1, and adds the rows on_tokens ended to
    `ended_at` (at their step of the whole generation). Returns (tokens_BN, carry)."""
    B = prompt_BP.shape[0]
    stream_id = next(_SINK_IDS)
    sink = _Stream(lambda i, t, d: on_tokens(made + i, t, d), B, eos_id)
    sink.done_B = done_B.copy()  # rows that ended in an earlier chunk stay ended
    _SINKS[stream_id] = sink
    try:
        if carry is None:
            out_BN, carry = _program(params, new_cache(config=config, batch=B), prompt_BP,
                                     start_B, key, *knobs, n, np.int32(stream_id),
                                     np.int32(0), np.int32(start_B.min()), config=config,
                                     budget=chunk, stream=True, carry=True)
        else:
            out_BN, carry = _continued(params, carry, key, np.int32(made), *knobs, n,
                                       np.int32(stream_id), config=config, budget=chunk,
                                       stream=True)
        out_BN = np.asarray(out_BN)  # waits for the chunk
        ended_at.update({b: made + i for b, i in sink.ended_at.items()})
        return out_BN, carry
    finally:
        _SINKS.pop(stream_id, None)

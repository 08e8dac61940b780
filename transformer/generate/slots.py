"""Continuous batching: B rows ("slots") of one preallocated KV cache, each decoding its own
text with its own key, positions and sampling knobs. A text joins a free slot between chunks
and leaves when done; the others never wait for it.

    slots = Slots(config, params, max_batch=8)      the cache for 8 rows, allocated once
    slots.warm_up()                                 compiles every program requests will run
    token = slots.admit(b, prompt_ids, seed=, choice=, temperature=, top_k=, top_p=, limit=)
    tokens_BK, made_B = slots.run_chunk()           CHUNK more tokens for every live slot
    slots.release(b)

The step over the cache, the sampling and the window policies are step.py's, as decode.py's
are: this module only decides which rows run, where their cache rows are, and when.
Row b holds exactly what `decode.generate` holds for its text alone, so it samples the same
tokens (up to the rounding of batched matmuls, as `--num_samples` batches do): its L prompt
tokens at slots 0 .. L-1, their padding up to the bucket P after them (overwritten by
decoding before any query reads it, so it takes no slot of the context), its token n at slot
L + n, its positions counted from its first token, token i drawn with the key
fold_in(fold_in(key(seed), choice), i), and the window policy applied at the same token. What differs is that every row
has its own slot index (`index_B`): the cache write, the mask and the positions take one per
row, so rows need not be aligned, and a row's cache is never moved.

- `admit` prefills one row (a program per prompt bucket, its cache row cut out of the batch
  cache and written back in place) and samples its first token; `admit_many` prefills the
  rows that join together and share a prompt bucket in one call of a row bucket (the
  re-prefill's program below, compiled per row bucket and length).
- `run_chunk` runs CHUNK decode steps for the live rows at once (one compiled `fori_loop`),
  in the smallest row bucket R (1, 2, 4, ... max_batch) that holds them: their cache rows
  are cut out of the batch cache, decoded and written back, so a lone request pays for one
  row, not max_batch (a 16-row chunk cost ~8x a 1-row one on a 2-vCPU EPYC). A row in the
  bucket that is idle (free, ended by its end token or `limit`, or waiting for a re-prefill)
  does not advance: its forward pass is computed and thrown away (its write lands in a slot
  it will overwrite before reading). A row's tokens are the same in any bucket: its matmul
  rows, key and knobs are its own.
- Under "reprefill" (step.window_policy) a row whose S slots are full is re-prefilled
  between chunks (`_reprefill`, the same W tokens and positions as decode's), then goes on.
  Every row that filled by the same chunk is re-prefilled in one call, compiled per row bucket
  as the chunk is (a bucket's spare rows repeat one of them: the same writes twice), not
  one one-row call each (at 8 clients asking past the context those took ~40% of the
  device thread).
  Under "roll" a row's cache is a ring and it never stops.

Every program has fixed shapes (one chunk per row bucket, the full S slots), so nothing
compiles after warm_up, and memory is fixed at start-up: the cache plus at most S tokens of
history per row. Attention reads all S slots of every row: a row's empty and stale slots are masked.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import ModelConfig
from transformer.generate import step

CHUNK = step.STREAM_EVERY  # tokens per device call: the streaming granularity of generate


def _row_key(seed, choice, i):
    """Key data of token i of choice `choice` of seed `seed`: decode's key of row b at step i
    (step.token_key), b being the row a sample.py batch would give that choice."""
    return step.token_key(jax.random.key(seed), choice, i)


def _prefill(params, cache, row, tokens_1P, start, last, seed, choice, i, temperature, top_k,
             top_p, *, config: ModelConfig):
    """Writes one row's P tokens at its slots 0 .. P-1 (positions from its first real token,
    `start`) and samples its token i from the logits of token `last` (its prompt's last: the
    padding after it is not read). Returns (cache, token)."""
    G = config.kv_heads
    row_cache = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, row * G, G, axis=0),
                             cache)
    row_cache, token_1 = step.prefill(config, params, row_cache, tokens_1P,
                                      jnp.reshape(start, (1,)), last,
                                      _row_key(seed, choice, i)[None], (temperature, top_k, top_p))
    cache = jax.tree.map(lambda x, r: jax.lax.dynamic_update_slice_in_dim(x, r, row * G, axis=0),
                         cache, row_cache)
    return cache, token_1[0]


def _take_rows(cache, slot_R, G: int):
    """The cache rows `slot_R` of a B-row cache (every layer's [B·G, S, K] arrays)."""
    def take(x_NSK):
        B = x_NSK.shape[0] // G
        R = slot_R.shape[0]
        return x_NSK.reshape(B, G, *x_NSK.shape[1:])[slot_R].reshape(R * G, *x_NSK.shape[1:])
    return jax.tree.map(take, cache)


def _put_rows(cache, slot_R, rows_cache, G: int, unique: bool = True):
    """`rows_cache` written back over the cache rows `slot_R` (in place under donation).
    With `unique=False` a slot may repeat, with the same rows each time."""
    def put(x_NSK, new_NSK):
        B, R = x_NSK.shape[0] // G, slot_R.shape[0]
        x_BGSK = x_NSK.reshape(B, G, *x_NSK.shape[1:])
        new_RGSK = new_NSK.reshape(R, G, *x_NSK.shape[1:])
        return x_BGSK.at[slot_R].set(new_RGSK, unique_indices=unique).reshape(x_NSK.shape)
    return jax.tree.map(put, cache, rows_cache)


def _reprefill_rows(params, cache, slot_R, tokens_RW, start_R, last_R, seed_R, choice_R, i_R,
                    temperature_R, top_k_R, top_p_R, *, config: ModelConfig):
    """`_prefill` for R rows at once, all of one length (W for a re-prefill, a prompt bucket
    for `admit_many`; row r's token from the logits of its token last_R[r]), each at its own
    cache row `slot_R[r]` (a slot may repeat: the bucket's padding repeats a row, whose
    writes are then the same), with its own positions, key and knobs. Returns (cache,
    token_R). Each row's token is the one its one-row prefill gives: its matmul rows, key
    and knobs are its own (sample_rows, as the chunk samples)."""
    G = config.kv_heads
    rows_cache, token_R = step.prefill(config, params, _take_rows(cache, slot_R, G), tokens_RW,
                                       start_R, last_R, jax.vmap(_row_key)(seed_R, choice_R, i_R),
                                       (temperature_R, top_k_R, top_p_R))
    return _put_rows(cache, slot_R, rows_cache, G, unique=False), token_R


class _Rows(NamedTuple):
    """The per-row state a chunk reads and advances (arrays of B)."""
    token: jax.Array    # the last token sampled, not yet in the cache
    index: jax.Array    # the slot it goes to (counted from the text's start)
    i: jax.Array        # how many tokens the row has sampled
    live: jax.Array     # the row is decoding (admitted, not ended)


def _chunk(params, cache, rows: _Rows, start_B, seed_B, choice_B, limit_B, temperature_B,
           top_k_B, top_p_B, eos_B, *, config: ModelConfig, steps: int):
    """`steps` decode steps for every row that can go. Returns (cache, rows, tokens_BK) with
    tokens_BK[b, t] the row's t-th new token of this chunk (step.PAD_ID where it made none)."""
    B, S = start_B.shape[0], config.max_seq_len
    ring = step.window_policy(config) == "roll"
    # Every row's keys for the chunk's steps, before the loop (decode does the same: a
    # threefry inside the loop body made XLA copy the cache every step).
    keys_KB2 = jax.vmap(lambda t: jax.vmap(_row_key)(seed_B, choice_B, rows.i + t))(
        jnp.arange(steps))

    def advance(t, carry):
        cache, rows, out_BK = carry
        go_B = rows.live
        if not ring:
            go_B &= rows.index < S  # a full cache waits for the host's re-prefill
        # Each row with its own slot, knobs and key: the token decode gives it alone.
        cache, token_B = step.next_token(config, params, cache, rows.token, rows.index, start_B,
                                         keys_KB2[t], (temperature_B, top_k_B, top_p_B))
        token_B = jnp.where(go_B, token_B, rows.token)
        out_BK = jax.lax.dynamic_update_slice(
            out_BK, jnp.where(go_B, token_B, step.PAD_ID)[:, None], (0, t))
        i_B = rows.i + go_B
        rows = _Rows(token_B, rows.index + go_B, i_B,
                     rows.live & ~(go_B & (token_B == eos_B)) & (i_B < limit_B))
        return cache, rows, out_BK

    out_BK = jnp.full((B, steps), step.PAD_ID, jnp.int32)
    return jax.lax.fori_loop(0, steps, advance, (cache, rows, out_BK))


def _rows_chunk(params, cache, slot_R, rows: _Rows, knobs, *, config: ModelConfig, steps: int):
    """`_chunk` for the R cache rows `slot_R` (distinct slots) of the B-row cache: they are cut
    out once, decoded `steps` tokens and written back, so the chunk costs R rows, not B. With
    R = B the rows are all of them, in order, and the cache is used as it is. The other
    slots are not touched. Returns (cache, rows, tokens_RK) as `_chunk` does for the R rows."""
    G, R = config.kv_heads, slot_R.shape[0]
    B = jax.tree.leaves(cache)[0].shape[0] // G
    if R == B:
        return _chunk(params, cache, rows, *knobs, config=config, steps=steps)
    rows_cache, rows, out_RK = _chunk(params, _take_rows(cache, slot_R, G), rows, *knobs,
                                      config=config, steps=steps)
    return _put_rows(cache, slot_R, rows_cache, G), rows, out_RK


def row_buckets(max_batch: int) -> list[int]:
    """The chunk programs' row counts: the powers of two below max_batch, and max_batch. A
    chunk runs the smallest that holds the live rows: a lone request pays for one row, and
    there are log2(max_batch) + 1 programs to compile, once."""
    out, R = [], 1
    while R < max_batch:
        out.append(R)
        R *= 2
    return out + [max_batch]


@functools.lru_cache(maxsize=16)
def _programs(config: ModelConfig, chunk: int):
    """The prefill, the chunk (one program per row bucket: its shapes) and the re-prefill (one
    per row bucket and length) of `config`, shared by every Slots of that config and chunk:
    a second Slots (a test's, a restarted engine's) traces and lowers none of them again."""
    return (jax.jit(functools.partial(_prefill, config=config), donate_argnums=1),
            jax.jit(functools.partial(_rows_chunk, config=config, steps=chunk),
                    donate_argnums=1),
            jax.jit(functools.partial(_reprefill_rows, config=config), donate_argnums=1))


@dataclasses.dataclass
class _Slot:
    """A busy row's history: the token in each filled slot (what a re-prefill reads; its
    knobs are in the Slots' per-row arrays, which the chunk reads too)."""
    history: list


class Slots:
    """B slots of one KV cache and the compiled programs that decode them (module doc)."""

    def __init__(self, config: ModelConfig, params, max_batch: int, chunk: int = CHUNK):
        self.config, self.params = step.setup(config, params, max_batch)  # once
        self.B, self.S, self.chunk = max_batch, config.max_seq_len, chunk
        self.cache = step.new_cache(config=self.config, batch=max_batch)
        self.token = np.zeros(max_batch, np.int32)
        self.index = np.zeros(max_batch, np.int32)
        self.i = np.zeros(max_batch, np.int32)
        self.live = np.zeros(max_batch, bool)
        self.slots: list[_Slot | None] = [None] * max_batch
        self.prefill, self.step, self.reprefill = _programs(self.config, chunk)
        self.row_buckets = row_buckets(max_batch)
        # Every row's knobs, as the chunk reads them (set at admit; a free row's are inert).
        self.start = np.zeros(max_batch, np.int32)
        self.seed = np.zeros(max_batch, np.int32)
        self.choice = np.zeros(max_batch, np.int32)
        self.limit = np.zeros(max_batch, np.int32)
        self.temperature = np.zeros(max_batch, np.float32)
        self.top_k = np.zeros(max_batch, np.int32)
        self.top_p = np.ones(max_batch, np.float32)
        self.eos = np.full(max_batch, -1, np.int32)

    # --- the programs ------------------------------------------------------------------------
    def buckets(self) -> list[int]:
        """The prefill lengths: every prompt bucket, and W (a re-prefill's length)."""
        out, P = set(), step.MIN_BUCKET
        while True:
            out.add(min(P, self.S))
            if P >= self.S:
                break
            P *= 2
        if step.window_policy(self.config) == "reprefill":
            out.add(step.keep_length(self.S))
        return sorted(out)

    def warm_up(self) -> None:
        """Compiles every prefill length (on slot 0, which stays free), and the chunk and the
        re-prefill at every row bucket (on free rows, which do not advance), the latter also
        at every prompt bucket for rows admitted together (`admit_many`)."""
        for P in self.buckets():
            self._run_prefill(0, [step.PAD_ID] * P, 0, P - 1, 0, 0, 0, (0.0, 0, 1.0))
        self.live[:] = False
        for R in self.row_buckets:
            self._run_rows(np.arange(R))
            lengths = set(self.buckets()) if R > 1 else set()  # admit_many's prefills
            if step.window_policy(self.config) == "reprefill":
                lengths.add(step.keep_length(self.S))
            for P in sorted(lengths):
                self._run_reprefill([0] * R, [[step.PAD_ID] * P] * R, [P - 1] * R)

    def bucket(self, rows: int) -> int:
        """The smallest row bucket that holds `rows` rows."""
        return next(R for R in self.row_buckets if R >= rows)

    def _run_prefill(self, b, tokens, start, last, seed, choice, i, knobs) -> int:
        temperature, top_k, top_p = knobs
        self.cache, token = self.prefill(
            self.params, self.cache, np.int32(b), np.asarray([tokens], np.int32),
            np.int32(start), np.int32(last), np.int32(seed), np.int32(choice), np.int32(i),
            np.float32(temperature), np.int32(top_k), np.float32(top_p))
        return int(token)

    # --- rows ----------------------------------------------------------------------------------
    def free(self) -> list[int]:
        return [b for b in range(self.B) if self.slots[b] is None]

    def admit(self, b: int, prompt, *, seed: int, choice: int, temperature: float,
              top_k: int, top_p: float, limit: int, eos: int = -1) -> int:
        """Prefills slot b with a prompt (token ids; its last S if longer), samples its first
        token and returns it. `limit`: the most tokens the row makes; `eos`: its end token."""
        return self.admit_many([(b, prompt, dict(seed=seed, choice=choice,
                                                 temperature=temperature, top_k=top_k,
                                                 top_p=top_p, limit=limit, eos=eos))])[0]

    def admit_many(self, entries) -> list[int]:
        """`admit` for several slots: entries (b, prompt, knobs as admit's keywords). Rows
        whose prompts pad to the same bucket P are prefilled in one call of the smallest row
        bucket that holds them (the re-prefill's program, which is a prefill of R rows of
        one length: each row's token is the one its one-row prefill gives), not one call
        each: at 8 clients the one-row prefills took a third of the device thread. Returns
        each entry's first token."""
        groups: dict[int, list] = {}
        for n, (b, prompt, knobs) in enumerate(entries):
            # The prompt (its last S tokens) at slots 0 .. L-1 and its padding to the bucket
            # after it, as decode lays out a row alone: the padding takes no slot.
            prompt = [int(t) for t in list(prompt)[-self.S:]]
            P = step.prompt_bucket(len(prompt), self.S)
            tokens = prompt + [step.PAD_ID] * (P - len(prompt))
            self.slots[b] = _Slot(prompt)
            self.start[b], self.seed[b], self.choice[b] = 0, knobs["seed"], knobs["choice"]
            self.limit[b], self.eos[b] = knobs["limit"], knobs.get("eos", -1)
            self.temperature[b], self.top_k[b], self.top_p[b] = (
                knobs["temperature"], knobs["top_k"], knobs["top_p"])
            self.i[b] = 0
            groups.setdefault(P, []).append((n, b, tokens, len(prompt)))
        out = [0] * len(entries)
        for P, group in groups.items():
            if len(group) == 1:
                (n, b, tokens, L), = group
                knobs = (self.temperature[b], self.top_k[b], self.top_p[b])
                token_R = [self._run_prefill(b, tokens, self.start[b], L - 1, self.seed[b],
                                             self.choice[b], 0, knobs)]
            else:
                token_R = self._run_reprefill([b for _, b, _, _ in group],
                                              [t for _, _, t, _ in group],
                                              [L - 1 for *_, L in group])
            for (n, b, tokens, L), token in zip(group, token_R):
                self.token[b], self.index[b], self.i[b] = token, L, 1
                self.live[b] = token != self.eos[b] and self.limit[b] > 1
                out[n] = token
        return out

    def reset(self) -> None:
        """Every row released and a new empty cache: after a failed device call, which may have
        consumed the donated cache."""
        for b in range(self.B):
            self.release(b)
        self.cache = step.new_cache(config=self.config, batch=self.B)

    def release(self, b: int) -> None:
        self.slots[b] = None
        self.live[b] = False

    def _reprefill(self, need) -> dict[int, int]:
        """Slots `need` have their S slots full: each one's last W tokens (the unwritten one
        included) into its slots 0 .. W-1 with positions from 0, and its next token
        (decode's `reprefill`), all in one call of the smallest row bucket that holds them.
        Returns {slot: its token}."""
        W = step.keep_length(self.S)
        history_RS = np.asarray([self.slots[b].history for b in need], np.int32)
        tokens_RW, self.start[need] = step.reprefill_window(history_RS, self.token[need],
                                                           self.start[need])
        for b, tokens in zip(need, tokens_RW.tolist()):
            self.slots[b].history = tokens
        token_R = self._run_reprefill(need, tokens_RW, [W - 1] * len(need))
        for b, token in zip(need, token_R):
            self.token[b], self.index[b], self.i[b] = token, W, self.i[b] + 1
            self.live[b] = token != self.eos[b] and self.i[b] < self.limit[b]
        return dict(zip(need, token_R))

    def _run_reprefill(self, need, tokens, last) -> list[int]:
        """One re-prefill call for the slots `need` (their W tokens each; each one's token from
        the logits of its token `last`), padded to a row bucket by repeating the first slot
        (its writes land twice, the same). Returns the tokens of `need`."""
        n = len(need)
        R = self.bucket(n)
        rows = np.asarray(list(need) + [need[0]] * (R - n), np.int32)
        tokens_RW = np.asarray(list(tokens) + [tokens[0]] * (R - n), np.int32)
        last_R = np.asarray(list(last) + [last[0]] * (R - n), np.int32)
        self.cache, token_R = self.reprefill(
            self.params, self.cache, rows, tokens_RW, self.start[rows], last_R, self.seed[rows],
            self.choice[rows], self.i[rows], self.temperature[rows], self.top_k[rows],
            self.top_p[rows])
        return np.asarray(token_R)[:n].tolist()

    def run_chunk(self) -> tuple[np.ndarray, np.ndarray]:
        """Up to `chunk` new tokens for every live row. Returns (tokens_BK, made_B): row b's
        new tokens are tokens_BK[b, :made_B[b]] (a re-prefill's token first, if it had one)."""
        reprefilled = {}
        if step.window_policy(self.config) == "reprefill":
            need = np.flatnonzero(self.live & (self.index >= self.S)).tolist()
            if need:
                reprefilled = self._reprefill(need)
        out_BK = np.full((self.B, self.chunk), step.PAD_ID, np.int32)
        live = np.flatnonzero(self.live)
        before_i, before_token = self.i.copy(), self.token.copy()
        if len(live):
            # The live rows, and as many idle ones as the bucket has room for (they do not
            # advance; their writes land in slots they overwrite before reading them).
            R = self.bucket(len(live))
            idle = np.flatnonzero(~self.live)[:R - len(live)]
            rows = np.arange(R) if R == self.B else np.sort(np.concatenate([live, idle]))
            out_BK[rows] = self._run_rows(rows)
        made_B = self.i - before_i
        if step.window_policy(self.config) == "reprefill":
            for b in np.flatnonzero(made_B):  # the tokens the chunk wrote into the cache
                self.slots[b].history += [int(before_token[b])] + out_BK[b, :made_B[b] - 1].tolist()
        if reprefilled:
            out_BK = np.concatenate([np.zeros((self.B, 1), np.int32), out_BK], axis=1)
            for b in range(self.B):
                if b in reprefilled:
                    out_BK[b, 0] = reprefilled[b]
                else:
                    out_BK[b, :-1] = out_BK[b, 1:]
            made_B = made_B + np.asarray([b in reprefilled for b in range(self.B)])
        return out_BK, made_B

    def _run_rows(self, rows) -> np.ndarray:
        """One chunk for the cache rows `rows` (distinct, sorted); their new state is kept.
        Returns their tokens_RK."""
        knobs = (self.start[rows], self.seed[rows], self.choice[rows], self.limit[rows],
                 self.temperature[rows], self.top_k[rows], self.top_p[rows], self.eos[rows])
        state = _Rows(self.token[rows], self.index[rows], self.i[rows], self.live[rows])
        self.cache, state, out_RK = self.step(self.params, self.cache,
                                              np.asarray(rows, np.int32), state, knobs)
        (self.token[rows], self.index[rows], self.i[rows], self.live[rows]), out_RK = (
            jax.device_get((tuple(state), out_RK)))
        return out_RK

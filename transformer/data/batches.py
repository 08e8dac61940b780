"""Integer batches, each a pure function of (seed, split, index): a resumed run sees the same data.

Each row has its own random stream, seeded by (seed, split, index, row), so any subset of a
batch's rows can be built alone: on several hosts each process builds only the rows its
devices hold (`rows=`), and together they form exactly the batch one process would build.

A batch is a dict of int32 arrays:
    inputs   [B, T]   tokens fed to the model
    targets  [B, T]   the next token at every position (inputs shifted by one)
    weights  [B, T]   1.0 where the loss counts, 0.0 where it does not

Sources:
- `TokenStream`: random windows of a tokenized corpus, `val_fraction` of it held out.
- `CopyTask`: n random tokens followed by the same n again; only the copied half counts, and
  a model can only predict it by attending back n positions (attention must move information).
- `RandomTokens`: i.i.d. uniform tokens. Nothing is predictable, so the loss cannot fall below
  ln(vocab) unless the causal mask leaks the future.
"""

from __future__ import annotations

import fractions

import numpy as np

from transformer.data.corpus import CorpusError

_SPLITS = {"train": 0, "val": 1}


def _row_rngs(seed: int, split: str, index: int, batch_size: int, rows) -> list:
    """One generator per requested row (default: every row of the batch)."""
    rows = range(batch_size) if rows is None else rows
    return [np.random.default_rng([seed, _SPLITS[split], index, int(r)]) for r in rows]


def split_blocks(seq, block: int, val_fraction: float) -> tuple[list, list]:
    """(training pieces, held-out pieces) of `seq` (tokens or text) cut into blocks of `block`.
    Block i is held out when the running count floor(i·f) steps up (f as a fraction p/q, in
    integers): every k-th block for f = 1/k, and f of the blocks for any other f (0.3 holds
    out 30 of 100, not every 3rd). Too short for one held-out block: the tail is held out."""
    f = fractions.Fraction(val_fraction).limit_denominator(1000)
    p, q = f.numerator, f.denominator
    starts = range(0, len(seq), block)
    held = [(i + 1) * p // q > i * p // q for i in range(len(starts))]
    val = [seq[s:s + block] for s, h in zip(starts, held) if h]
    train = [seq[s:s + block] for s, h in zip(starts, held) if not h]
    if not val:
        val, train = [seq[-block:]], [seq[:-block]]
    return train, val


def split_text(text: str, seq_len: int, val_fraction: float) -> tuple[str, str]:
    """(training text, held-out text), blocks cut as TokenStream cuts tokens, so that a
    tokenizer learned on the text (BPE) never sees the held-out part."""
    train, val = split_blocks(text, max(seq_len + 1, len(text) // TokenStream.BLOCKS),
                              val_fraction)
    return "".join(train), "".join(val)


class TokenStream:
    """Windows of a token array. Validation holds out `val_fraction` of the corpus as evenly
    spread blocks (of about 100: split_blocks), so it samples the same mix of text as training
    rather than whatever happens to sit at the end of the corpus."""

    BLOCKS = 100

    def __init__(self, tokens: np.ndarray, seq_len: int, val_fraction: float,
                 val_tokens: np.ndarray | None = None):
        """`tokens` split into blocks here; or, with `val_tokens`, the two splits as given
        (text split before tokenizing: split_text)."""
        if val_tokens is None:
            train, val = split_blocks(tokens, max(seq_len + 1, len(tokens) // self.BLOCKS),
                                      val_fraction)
            tokens_in = len(tokens)
        else:
            train, val = [tokens], [val_tokens]
            tokens_in = len(tokens) + len(val_tokens)
        self.splits = {"train": np.concatenate(train), "val": np.concatenate(val)}
        if min(map(len, self.splits.values())) < seq_len + 1:
            raise CorpusError(
                f"the corpus has {tokens_in} tokens, too few for training and validation "
                f"windows of {seq_len + 1} tokens: give more text or a smaller model.max_seq_len")
        self.seq_len = seq_len

    def batch(self, seed: int, split: str, index: int, batch_size: int, rows=None) -> dict:
        """The batch, or only its `rows` (a sequence of row numbers) when given."""
        data, T = self.splits[split], self.seq_len
        starts_B = np.array([rng.integers(0, len(data) - T)
                             for rng in _row_rngs(seed, split, index, batch_size, rows)])
        window_BT1 = data[starts_B[:, None] + np.arange(T + 1)[None, :]]
        return {"inputs": window_BT1[:, :-1].astype(np.int32),
                "targets": window_BT1[:, 1:].astype(np.int32),
                "weights": np.ones((len(starts_B), T), np.float32)}


class CopyTask:
    def __init__(self, vocab_size: int, seq_len: int):
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def batch(self, seed: int, split: str, index: int, batch_size: int, rows=None) -> dict:
        T = self.seq_len
        n = (T + 1 + 1) // 2
        half_Bn = np.stack([rng.integers(0, self.vocab_size, size=n)
                            for rng in _row_rngs(seed, split, index, batch_size, rows)])
        seq_BT1 = np.concatenate([half_Bn, half_Bn], axis=1)[:, : T + 1]
        weights_BT = np.zeros((len(half_Bn), T), np.float32)
        weights_BT[:, n - 1:] = 1.0  # targets seq[n:] repeat seq[:n]
        return {"inputs": seq_BT1[:, :-1].astype(np.int32),
                "targets": seq_BT1[:, 1:].astype(np.int32), "weights": weights_BT}


class RandomTokens:
    def __init__(self, vocab_size: int, seq_len: int):
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def batch(self, seed: int, split: str, index: int, batch_size: int, rows=None) -> dict:
        seq_BT1 = np.stack([rng.integers(0, self.vocab_size, size=self.seq_len + 1)
                            for rng in _row_rngs(seed, split, index, batch_size, rows)])
        return {"inputs": seq_BT1[:, :-1].astype(np.int32),
                "targets": seq_BT1[:, 1:].astype(np.int32),
                "weights": np.ones((len(seq_BT1), self.seq_len), np.float32)}

"""Synthetic batches, each a pure function of (seed, split, index): a resumed run sees the same data.

Each row has its own random stream, seeded by (seed, split, index, row), so any subset of a
batch's rows can be built alone: on several hosts each process builds only the rows its
devices hold (`rows=`), and together they form exactly the batch one process would build.

A batch is a dict of int32 arrays:
    inputs   [B, T]   tokens fed to the model
    targets  [B, T]   the next token at every position (inputs shifted by one)
    weights  [B, T]   1.0 where the loss counts, 0.0 where it does not

Text is read from a prepared folder (prepared.py; a corpus named directly is prepared into the
cache first: cache.py). The synthetic tasks, which need no text:
- `CopyTask`: n random tokens followed by the same n again; only the copied half counts, and
  a model can only predict it by attending back n positions (attention must move information).
- `RandomTokens`: i.i.d. uniform tokens. Nothing is predictable, so the loss cannot fall below
  ln(vocab) unless the causal mask leaks the future.
"""

from __future__ import annotations

import numpy as np

_SPLITS = {"train": 0, "val": 1}


def _row_rngs(seed: int, split: str, index: int, batch_size: int, rows) -> list:
    """One generator per requested row (default: every row of the batch)."""
    rows = range(batch_size) if rows is None else rows
    return [np.random.default_rng([seed, _SPLITS[split], index, int(r)]) for r in rows]


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

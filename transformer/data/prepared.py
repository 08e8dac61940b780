"""Reading a prepared folder (prepare.py wrote it): token shards read window by window.

A split's tokens (its shards one after another) are cut into windows of seq_len + 1 tokens
that overlap by one (window w starts at token w·seq_len of its shard; a window never spans two
shards), so every token is a target once per epoch. The training run's row r of batch i is
window number g = i·batch_size + r of an endless sequence of epochs: epoch g // W visits every
window once, in an order that is a permutation of the W windows keyed by (seed, split, epoch).

The permutation is a Feistel network over the smallest power of four ≥ W, walking the cycle
until it lands below W: no table, O(1) memory whatever the set's size, and any row computed
alone (each process builds only its rows). Start-up reads the manifest and opens the shards;
a window is read with pread (see _Shard), so nothing grows with the data but the page cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from transformer.data import split as split_rule
from transformer.data import tokenizers
from transformer.data.corpus import CorpusError

FORMAT = 1
_SPLITS = {"train": 0, "val": 1}
_ROUNDS = 6  # Feistel rounds; 4 already mix well (Luby-Rackoff), 6 for margin


def is_prepared(path) -> bool:
    """A prepared folder is one with a manifest (written last, after every shard)."""
    try:
        return (Path(path).expanduser() / "manifest.json").is_file()
    except (OSError, ValueError):
        return False


def read_manifest(folder) -> dict:
    folder = Path(folder).expanduser()
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CorpusError(f"{folder}: unreadable manifest.json ({e})") from None
    if not isinstance(manifest, dict):
        raise CorpusError(f"{folder}: damaged manifest.json (not a JSON object); prepare the "
                          "folder again")
    if manifest.get("format") != FORMAT:
        raise CorpusError(f"{folder}: prepared with format {manifest.get('format')}, this "
                          f"version reads format {FORMAT}; prepare it again")
    _check(folder, manifest)
    return manifest


def _check(folder: Path, m: dict) -> None:
    """What the loader reads of a manifest is there, of the right type: a damaged one is one
    line naming the part, not a traceback from deep inside the loader."""
    def need(ok: bool, part: str) -> None:
        if not ok:
            raise CorpusError(f"{folder}: damaged manifest.json (its {part!r} is missing or "
                              "wrong); prepare the folder again")
    tok = m.get("tokenizer")
    need(isinstance(tok, dict) and tok.get("kind") in ("byte", "char", "bpe")
         and isinstance(tok.get("sha256"), str) and isinstance(tok.get("eot", 0), (int, type(None)))
         and (tok["kind"] == "byte" or isinstance(tok.get("file"), str)), "tokenizer")
    need(m.get("dtype") in ("uint16", "uint32"), "dtype")
    splits = m.get("splits")
    for name in _SPLITS:
        split = splits.get(name) if isinstance(splits, dict) else None
        need(isinstance(split, dict) and all(isinstance(split.get(k), int)
                                             for k in ("tokens", "bytes"))
             and isinstance(split.get("shards"), list)
             and all(isinstance(x, dict) and isinstance(x.get("file"), str)
                     and isinstance(x.get("tokens"), int) for x in split["shards"]),
             f"splits.{name}")


def load_tokenizer(folder, manifest: dict):
    """The folder's tokenizer, as the project's tokenizer object (saved with checkpoints)."""
    spec = manifest["tokenizer"]
    if spec["kind"] == "byte":
        tok = tokenizers.ByteTokenizer(eot=spec["eot"] is not None)
    else:
        from tokenizers import Tokenizer
        path = Path(folder).expanduser() / spec["file"]
        try:
            hf = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
            raise CorpusError(f"{path}: damaged ({' '.join(str(e).split())}); prepare the "
                              "folder again") from None
        if spec["kind"] == "char":  # the characters in id order, the end token after them
            vocab = sorted((i, t) for t, i in hf.get_vocab().items() if i != spec["eot"])
            tok = tokenizers.CharTokenizer("".join(t for _, t in vocab),
                                           eot=spec["eot"] is not None)
        else:
            tok = tokenizers.BPETokenizer(hf, spec["eot"])
    if tokenizers.fingerprint(tok) != spec["sha256"]:
        raise CorpusError(f"{folder}: tokenizer.json does not match the manifest's hash; "
                          "prepare the folder again")
    return tok


class PreparedSet:
    """Batches of windows from a prepared folder (the same `batch` as the synthetic tasks)."""

    def __init__(self, folder, seq_len: int):
        self.folder = Path(folder).expanduser()
        self.manifest = read_manifest(self.folder)
        self.tokenizer = load_tokenizer(self.folder, self.manifest)
        self.seq_len = T = seq_len
        dtype = np.dtype(self.manifest["dtype"])
        self.shards, self.starts, self.windows = {}, {}, {}
        for split in _SPLITS:
            maps = []
            for shard in self.manifest["splits"][split]["shards"]:
                path = self.folder / shard["file"]
                try:
                    maps.append(_Shard(path, dtype))
                except (OSError, ValueError) as e:
                    raise CorpusError(f"{path}: {e}; prepare the folder again") from None
                if len(maps[-1]) != shard["tokens"]:
                    raise CorpusError(f"{path}: {len(maps[-1])} tokens, the manifest says "
                                      f"{shard['tokens']}; prepare the folder again")
            counts = np.array([max(0, (len(m) - 1) // T) for m in maps], np.int64)
            self.shards[split] = maps
            self.starts[split] = np.concatenate([[0], np.cumsum(counts)])
            self.windows[split] = int(counts.sum())
            if self.windows[split] == 0:
                raise CorpusError(
                    f"{self.folder}: the {split} split has "
                    f"{self.manifest['splits'][split]['tokens']:,} tokens, too few for one window "
                    f"of {T + 1}: prepare more text or use a smaller model.max_seq_len")

    def tokens(self, split: str) -> int:
        return self.manifest["splits"][split]["tokens"]

    def tokens_per_byte(self) -> float:
        """Validation tokens per UTF-8 byte of validation text (end-of-text tokens count as
        tokens and have no bytes)."""
        val = self.manifest["splits"]["val"]
        return val["tokens"] / max(1, val["bytes"])

    def window_numbers(self, seed: int, split: str, g: np.ndarray) -> np.ndarray:
        """Which window is the g-th one read (g ≥ 0, over endless epochs)."""
        n = self.windows[split]
        epoch, position = np.divmod(np.asarray(g, np.int64), n)
        out = np.empty_like(position)
        for e in np.unique(epoch):
            here = epoch == e
            out[here] = permute(position[here], n, (seed, _SPLITS[split], int(e)))
        return out

    def batch(self, seed: int, split: str, index: int, batch_size: int, rows=None) -> dict:
        """Batch `index`, or only its `rows`: row r is window index·batch_size + r."""
        rows = np.arange(batch_size) if rows is None else np.asarray(list(rows), np.int64)
        return self.read_windows(split, self.window_numbers(seed, split, index * batch_size + rows))

    def eval_windows(self, tokens: int) -> np.ndarray:
        """The validation windows an evaluation of `tokens` tokens scores (train.eval_tokens):
        tokens // seq_len of them (at least one), evenly spaced over the split in file order,
        so every run and every seed scores the same ones; every window when that is all of
        them or more, or when `tokens` is 0 (the whole split)."""
        return spaced(self.windows["val"], max(1, tokens // self.seq_len) if tokens else 0)

    def read_windows(self, split: str, w: np.ndarray) -> dict:
        """The rows of windows `w` (window numbers of `split`, in file order) as a batch."""
        T = self.seq_len
        w = np.asarray(w, np.int64)
        shard = np.searchsorted(self.starts[split], w, side="right") - 1
        offset = (w - self.starts[split][shard]) * T
        maps = self.shards[split]
        window_BT1 = np.stack([maps[s].read(o, T + 1) for s, o in zip(shard, offset)]
                              ).astype(np.int32) if len(w) else np.zeros((0, T + 1), np.int32)
        return {"inputs": window_BT1[:, :-1], "targets": window_BT1[:, 1:],
                "weights": np.ones((len(w), T), np.float32)}

    def describe(self, config, name: str | None = None) -> str:
        """The set (`name`, default "prepared set FOLDER"), how it was split, and what this run
        reads of it (epochs), for the start-up summary."""
        t, T = config.train, self.seq_len
        train = self.windows["train"]
        epochs = t.steps * t.batch_size / train
        repeat = "; repeats data" if epochs > 1 else ""
        name = name or f"prepared set {self.folder}"
        splits = self.manifest["splits"]
        held = split_rule.describe(self.manifest.get("split"), splits["val"],
                                   splits["train"]["bytes"] + splits["val"]["bytes"])
        return (f"{name} ({self.tokens('train'):,} train tokens = "
                f"{train:,} windows of {T + 1}, {self.tokens('val'):,} val tokens; {held}); "
                f"this run reads {epochs:.3g} epochs{repeat}; {self.scored(t.eval_tokens)}")

    def scored(self, tokens: int) -> str:
        """What the final evaluation scores (train.eval_tokens), for the data line."""
        n, k, T = self.windows["val"], len(self.eval_windows(tokens)), self.seq_len
        if k == n:
            why = "train.eval_tokens=0" if not tokens else \
                f"within train.eval_tokens={tokens:,}"
            return f"the final val loss scores the whole val split ({n * T:,} tokens, {why})"
        return (f"the final val loss scores {k * T:,} val tokens of {n * T:,} ({k:,} evenly "
                f"spaced windows of {n:,}, the same every run; train.eval_tokens=0: all)")


class _Shard:
    """A shard read window by window with pread. Not a memory map: the kernel maps ~64 KB of
    page cache around every faulting page (fault-around), all counted in the process's RSS:
    np.memmap windows of 2 KB put 100 MB into RSS per 1,280 windows of a 240 MB set, growing
    towards the set's size over a run. Read this way RSS stays flat; the page cache (shared by
    every process on the host) still keeps what is hot."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.fd = os.open(path, os.O_RDONLY)
        self.length = os.fstat(self.fd).st_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.length

    def read(self, start: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize
        return np.frombuffer(os.pread(self.fd, count * size, start * size), self.dtype)

    def __del__(self, _close=os.close):
        # os.close bound at definition: at interpreter exit the module's globals (os,
        # contextlib) may already be None when the last shard is collected.
        try:
            _close(self.fd)
        except (OSError, AttributeError):
            pass


def spaced(n: int, k: int) -> np.ndarray:
    """k window numbers evenly spaced over range(n) (window floor(i·n/k) for i < k), or all n
    when k is 0 or at least n. Depends on n and k alone: no seed."""
    if k <= 0 or k >= n:
        return np.arange(n, dtype=np.int64)
    return np.arange(k, dtype=np.int64) * n // k


def permute(x: np.ndarray, n: int, key) -> np.ndarray:
    """A permutation of range(n) applied to x (values in range(n)), keyed by `key` (a tuple of
    ints): a Feistel network over [0, 4^k) ⊇ [0, n), cycle-walked back into [0, n)."""
    x = np.asarray(x, np.uint64)
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = np.random.default_rng(list(key)).integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)

    def encrypt(v):
        left, right = v >> np.uint64(half), v & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << np.uint64(half)) | right

    y = encrypt(x)
    outside = y >= n
    while outside.any():  # at most a few walks: the domain is < 4n
        y[outside] = encrypt(y[outside])
        outside = y >= n
    return y.astype(np.int64)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every output bit depends on every input bit."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

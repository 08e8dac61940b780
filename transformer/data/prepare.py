"""Prepare a corpus once: documents → token shards, document offsets, tokenizer and manifest.

The command is `python -m transformer prepare` (its flags in tools/prepare.py):

    python -m transformer prepare stdlib --out=data/stdlib
    python -m transformer prepare books/ notes.txt --out=data/books --tokenizer=bpe \
        --vocab_size=8192
    python -m transformer prepare 'fineweb/sample/10BT/*.parquet' --out=data/fineweb \
        --tokenizer=path/to/gpt2/tokenizer.json
    python train.py --config.data.corpus=data/stdlib --config.model.vocab_size=0

The inputs (files, folders, globs, `stdlib`; Parquet, JSON Lines, text) are read by
sources.py, one document or text-file piece at a time (a piece is a unit of reading only).
Every document ends with one end-of-text token (the byte tokenizer's id 256, so its vocabulary
is 257). The split is split.py's rule, the same as the cache's: whole documents by a hash of
their text (a document over 1 MB in spans of at least 1 MB), or the tail of a corpus with too
few documents for that.

The folder (docs/data.md), written under a hidden temporary name and renamed when complete:
    manifest.json              what is in it, written last
    tokenizer.json             the `tokenizers` library's file (Tokenizer.from_file reads it)
    train_00000.bin ...        the tokens, uint16 when the vocabulary fits, else uint32
    train_00000.ends.npy ...   int64: where each document (or the part of one held in this
                               split: a span, the tail's cut) in that shard ends
    val_00000.bin, val_00000.ends.npy

Memory stays bounded whatever the input size: documents stream from disk in ~1 MB batches
through a bounded queue; only the current shard's document ends are kept.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from transformer.data import durable
from transformer.data import split as split_rule
from transformer.data import tokenizers
from transformer.data.corpus import CorpusError
from transformer.data.sources import PIECE_CHARS, Reader, expand, is_prepared_folder, kind_of
from transformer.data.split import is_val  # noqa: F401 -- prepare.is_val, where it was

FORMAT = 1
BATCH_CHARS = 1 << 20        # text handed to the encoder at once (~1 MB)
QUEUE_BATCHES = 4            # batches read ahead of the encoder: what bounds memory
SHARD_TOKENS = 1 << 28       # a shard closes at the first document end past this
SAMPLE_BYTES = 32_000_000    # BPE learns from at most this much training text (see docs/data.md)
SPLITS = ("train", "val")
_EOT_NAMES = (tokenizers.EOT, "</s>", "<|end_of_text|>", "<eos>")  # a given tokenizer's own EOT


def build_tokenizer(kind: str, vocab_size: int, sample, documents=None):
    """The tokenizer, with an end-of-text id: byte (vocabulary 257); bpe learned from
    `sample()` (an iterable of training documents); char, whose alphabet is every character
    of `documents()` (all of them, both splits: a character seen only in validation still
    needs an id; it learns no statistics); or a tokenizer.json file."""
    if kind == "byte":
        return tokenizers.ByteTokenizer(eot=True)
    if kind == "bpe":
        if vocab_size < 258:
            raise CorpusError(f"--vocab_size={vocab_size}: bpe needs at least 258 "
                              "(256 bytes, one merge, the end-of-text token)")
        return tokenizers.BPETokenizer.train(sample(), vocab_size, eot=True)
    if kind == "char":
        seen = set()
        for text in documents():
            seen.update(text)
        if not seen:
            raise CorpusError("no text in the input")  # (the same error as byte and bpe give)
        return tokenizers.CharTokenizer("".join(sorted(seen)), eot=True)
    path = Path(kind).expanduser()
    if not path.is_file():
        raise CorpusError(f"--tokenizer={kind}: expected byte, char, bpe or a tokenizer.json "
                          "file")
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
        raise CorpusError(f"--tokenizer={kind}: not a tokenizers file: "
                          f"{' '.join(str(e).split())}") from None
    eot = next((tok.token_to_id(t) for t in _EOT_NAMES if tok.token_to_id(t) is not None), None)
    if eot is None:
        ids = set(tok.get_vocab(with_added_tokens=True).values())
        tok.add_special_tokens([tokenizers.EOT])
        eot = tok.token_to_id(tokenizers.EOT)
        if eot in ids:  # the library numbers an added token by count: a gap below it
            raise CorpusError(f"--tokenizer={kind}: the end-of-text token added to it would be "
                              f"id {eot}, already the id of another token (its ids have gaps): "
                              f"give a file with its own end token ({', '.join(_EOT_NAMES)})")
    return tokenizers.BPETokenizer(tok, eot)


class Encoder:
    """Batches of texts → arrays of ids, on every core (the tokenizers library's threads), each
    text taken as text (tokenizers.ordinary: no special token is parsed in it or added to it;
    the end token is `_write`'s to place). Byte and char ids come from NumPy directly (the
    tokenizer.json gives the same ids, ~4x slower for char)."""

    def __init__(self, tokenizer):
        self.tok = tokenizers.ordinary(tokenizer.hf_tokenizer(), tokenizer.eot)
        self.kind = tokenizer.kind
        if self.kind == "char":  # code point -> id
            self.table = np.full(max(map(ord, tokenizer.chars)) + 1, -1, np.int64)
            self.table[[ord(c) for c in tokenizer.chars]] = np.arange(len(tokenizer.chars))

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        if self.kind in ("byte", "char"):
            return [self._direct(t) for t in texts]
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [np.asarray(e.ids, np.int64) for e in encode(texts, add_special_tokens=False)]

    def cut(self, head: str, rest: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids of the text head + rest, cut where `rest` begins: at the first token that
        starts there or after (a token across the cut stays with the head). Encoding the two
        apart is not always the whole's ids: a Metaspace tokenizer starts `rest` with a word
        start "▁" that the whole has only after a space."""
        if self.kind in ("byte", "char"):  # an id per byte or character: any cut keeps them
            return self._direct(head), self._direct(rest)
        whole = self.tok.encode(head + rest, add_special_tokens=False)
        at = next((i for i, (start, _) in enumerate(whole.offsets) if start >= len(head)),
                  len(whole.ids))
        ids = np.asarray(whole.ids, np.int64)
        return ids[:at], ids[at:]

    def _direct(self, text: str) -> np.ndarray:
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        ids = self.table[np.minimum(codes, len(self.table) - 1)]
        if (ids < 0).any() or (codes >= len(self.table)).any():
            bad = text[int(np.argmax((ids < 0) | (codes >= len(self.table))))]
            raise CorpusError(f"character {bad!r} is not in the char tokenizer's alphabet")
        return ids


class SplitWriter:
    """One split's shards: tokens appended as they come, the end of every document (or of the
    part of one in this split) recorded, a shard closed at such an end past SHARD_TOKENS."""

    def __init__(self, folder: Path, split: str, dtype, shard_tokens: int = SHARD_TOKENS):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards, self.documents, self.parts, self.tokens, self.bytes = [], 0, 0, 0, 0
        self._file = None

    def add(self, ids: np.ndarray, nbytes: int) -> None:
        if self._file is None:
            self._name = f"{self.split}_{len(self.shards):05d}"
            self._file = open(self.folder / f"{self._name}.bin", "wb")
            self._ends, self._length = [], 0
        self._file.write(ids.astype(self.dtype, copy=False).tobytes())
        self._length += len(ids)
        self.tokens += len(ids)
        self.bytes += nbytes

    def end(self, document: bool) -> None:
        """Ends what was added since the last end: a document, or (document=False) the part
        of one that continues in the other split."""
        self._ends.append(self._length)
        self.parts += 1
        self.documents += document
        if self._length >= self.shard_tokens:
            self._close_shard()

    def _close_shard(self) -> None:
        self._file.close()
        np.save(self.folder / f"{self._name}.ends.npy", np.asarray(self._ends, np.int64))
        self.shards.append({"file": f"{self._name}.bin", "tokens": self._length,
                            "parts": len(self._ends)})
        self._file = None

    def close(self) -> dict:
        if self._file is not None:
            self._close_shard()
        return {"documents": self.documents, "parts": self.parts, "tokens": self.tokens,
                "bytes": self.bytes, "shards": self.shards}


class Progress:
    """One line on stderr, redrawn twice a second: MB read, MB/s, ETA, tokens."""

    def __init__(self, plan, enabled: bool):
        self.plan, self.enabled = plan, enabled
        self.begin = self.last = time.perf_counter()

    def show(self, tokens: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < 0.5 and not final):
            return
        self.last = now
        done, total = (x / 1e6 for x in self.plan.progress())
        total = max(total, 1e-6)
        rate = done / max(now - self.begin, 1e-9)
        eta = (total - done) / rate if rate > 0 else 0.0
        print(f"\rprepare: {done:,.0f}/{total:,.0f} MB, {rate:.1f} MB/s, "
              f"ETA {eta:.0f}s, {tokens:,} tokens ", end="\n" if final else "",
              file=sys.stderr, flush=True)


class InputSplit:
    """The units of a Reader with their split (split.py's `rule`): what the command prepares."""

    def __init__(self, reader: Reader, rule: split_rule.Split):
        self.reader, self.rule = reader, rule
        files = reader.files
        self.name = f"{' '.join(map(str, files[:3]))}{' ...' if len(files) > 3 else ''}"

    def units(self):
        return self.rule.units(self.reader.units())

    def progress(self) -> tuple[int, int]:
        return self.reader.done, self.reader.total

    def skipped(self) -> dict:
        return dict(self.reader.counts)


def prepare(inputs, out, tokenizer: str = "byte", vocab_size: int = 8192,
            text_field: str = "text", val_fraction: float = 0.05,
            sample_bytes: int = SAMPLE_BYTES, overwrite: bool = False, progress: bool = False,
            command=None, shard_tokens: int = SHARD_TOKENS) -> dict:
    """Writes the prepared folder `out` and returns its manifest."""
    out = Path(out).expanduser()
    if not 0.0 < val_fraction < 1.0:
        raise CorpusError(f"--val_fraction={val_fraction}: must be strictly between 0 and 1")
    if tokenizer == "bpe" and sample_bytes < 1:
        # BPE learned from no text: 256 bytes and no merge, whatever --vocab_size asked for.
        raise CorpusError(f"--sample_bytes={sample_bytes}: bpe learns its merges from this "
                          f"much text; give at least 1 (default {SAMPLE_BYTES:,})")
    if out.exists() and not overwrite:
        raise CorpusError(f"--out={out} exists; pass --overwrite to replace it")
    if out.exists() and not (out.is_dir() and ((out / "manifest.json").is_file()
                                               or not any(out.iterdir()))):
        raise CorpusError(f"--out={out} exists and is not a prepared dataset (no manifest.json): "
                          "--overwrite replaces only those; choose another --out")
    # The folder is written beside its final name (write's temporary folder): the place must
    # take it, checked now rather than after all the tokenizing.
    there = next(p for p in out.absolute().parents if p.exists())
    if not there.is_dir() or not os.access(there, os.W_OK | os.X_OK):
        raise CorpusError(f"--out={out}: cannot write there ({there} is "
                          f"{'not writable' if there.is_dir() else 'a file'}); "
                          "choose another --out")
    inputs = [str(i) for i in inputs]
    # The folder being replaced is never input (an --out inside an input folder: a second run
    # would read the first one's manifest.json and tokenizer.json as documents).
    files = [p for p in expand(inputs) if not _under(p, out)]
    if not files:
        raise CorpusError(f"{' '.join(inputs)}: no input files outside --out={out}")
    # A prepared set inside an input folder is left out (sources.expand); one named as an
    # input is refused: its files are tokens and a manifest, not text.
    for spec in inputs:
        if Path(spec).is_dir() and is_prepared_folder(Path(spec)) and not _under(spec, out):
            raise CorpusError(f"{spec} is a prepared dataset (it has a manifest.json): its "
                              "files are tokens, not text; give the text it was made from")
    # A tokenizer.json from disk is loaded first: where cutting a text file into pieces would
    # not keep its ids (a Metaspace pre-tokenizer), text files are read whole (and one over
    # 1 MB is then held out whole, not in spans: spans are cut where pieces are).
    given = None if tokenizer in ("byte", "char", "bpe") else build_tokenizer(tokenizer, 0, None)
    cut = given is None or tokenizers.cut_keeps_ids(given, first_pieces(files))
    # A line with no boundary to cut at is cut anyway only where every cut keeps the ids.
    anywhere = tokenizer in ("byte", "char")
    rule = split_rule.choose(Reader(files, text_field, cut, anywhere).units(), val_fraction)
    plan = lambda: InputSplit(Reader(files, text_field, cut, anywhere), rule)  # noqa: E731
    begin = time.perf_counter()
    tok = given or build_tokenizer(tokenizer, vocab_size,
                                   lambda: training_sample(plan(), sample_bytes),
                                   lambda: (text for text, _, _ in plan().units()))
    learned = time.perf_counter() - begin
    extra = {"val_fraction": val_fraction, "text_field": text_field, "text_in_pieces": cut,
             "inputs": inputs, "command": command,
             "sources": [{"path": str(p), "size": (st := p.stat()).st_size,
                          "mtime": st.st_mtime} for p in files]}
    # Written by its absolute path: --out=. (or ..) has no name to put a temporary folder
    # beside and rename, and replacing it then deleted the old set and the new one with it.
    return write(Path(os.path.abspath(out)), plan(), tok, tokenizer, sample_bytes, learned,
                 extra, progress, shard_tokens, replace=True)


def _under(path: Path, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def first_pieces(files, count: int = 8, tries: int = 8) -> list[str]:
    """The first `count` pieces of the first text file that is cut into two or more (what
    tokenizers.cut_keeps_ids checks a given tokenizer on; of the first `tries` long enough:
    one with no line boundary is one piece), or none."""
    long = (p for p in files if kind_of(p) == "text" and p.stat().st_size >= 2 * PIECE_CHARS)
    for path in itertools.islice(long, tries):
        pieces = list(itertools.islice((t for t, _ in Reader([path]).units()), count))
        if len(pieces) > 1:
            return pieces
    return []


def training_sample(plan, sample_bytes: int):
    """The first `sample_bytes` of training text (counted in characters), in input order (what
    BPE learns from); the last text taken is cut there (one long line, a file read whole, a
    large record: the sample stays that size)."""
    taken = 0
    for text, _, split in plan.units():
        if taken >= sample_bytes:
            return
        if split == "train":
            text = text[: sample_bytes - taken]
            taken += len(text)
            yield text


def write(out: Path, plan, tok, tokenizer_source: str, sample_bytes: int, learned: float,
          extra: dict, progress: bool = False, shard_tokens: int = SHARD_TOKENS,
          replace: bool = True) -> dict:
    """Writes the folder `out` from `plan`'s units with `tok`, under a hidden temporary name
    renamed when complete (manifest last). replace=True replaces an existing `out` (the
    command's --overwrite, checked by the caller); replace=False leaves one that appeared
    meanwhile (another process prepared the same set) and returns its manifest."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    try:
        manifest = _write(plan, tmp, tok, tokenizer_source, sample_bytes, learned, progress,
                          shard_tokens)
        manifest.update(extra)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        durable.sync_tree(tmp)  # on disk before it has its name: a power loss too (durable.py)
        if out.exists() and replace:  # the old folder goes only once the new one is complete
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if replace or not (out / "manifest.json").is_file():
                raise
            manifest = json.loads((out / "manifest.json").read_text())  # prepared meanwhile
        durable.sync(out.parent)  # the rename itself
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _write(plan, folder: Path, tok, tokenizer_source, sample_bytes, learned, progress,
           shard_tokens) -> dict:
    begin = time.perf_counter()
    hf = tok.hf_tokenizer()
    hf.save(str(folder / "tokenizer.json"))
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    writers = {s: SplitWriter(folder, s, dtype, shard_tokens) for s in SPLITS}
    bar = Progress(plan, progress)
    encode = Encoder(tok)
    eot = np.asarray([] if tok.eot is None else [tok.eot], np.int64)
    open_in = None  # the split holding the start of a document not yet ended
    # The tail rule cuts one document's text where validation begins (split.py): its two
    # parts' ids are the whole document's ids cut there (Encoder.cut). So a training unit
    # that does not end its document waits for the next: a validation one is that cut.
    tail, head = plan.rule.tail_from is not None, None
    for batch in _read_ahead(plan):
        texts = [text for text, _, _ in batch]
        for ids, (text, ends, split) in zip(encode(texts), batch):
            nbytes = len(text.encode("utf-8", "surrogatepass"))
            if head is not None:
                if split == "val":
                    first, ids = encode.cut(head[0], text)
                    head = (head[0], first, head[2])
                writers["train"].add(head[1], head[2])
                head = None
            if tail and split == "train" and not ends:
                head, open_in = (text, ids, nbytes), split
                continue
            if open_in not in (None, split):  # the document goes on in the other split
                writers[open_in].end(document=False)
            if ends:  # one end token a document, after its last piece
                ids = np.concatenate([ids, eot])
            writers[split].add(ids, nbytes)
            if ends:
                writers[split].end(document=True)
            open_in = None if ends else split
        bar.show(sum(w.tokens for w in writers.values()))
    if head is not None:  # (never: the tail rule leaves text after its cut)
        writers["train"].add(head[1], head[2])
    if open_in is not None:
        writers[open_in].end(document=False)
    splits = {s: w.close() for s, w in writers.items()}
    seconds = {"tokenizer": round(learned, 2), "encode": round(time.perf_counter() - begin, 2)}
    bar.show(sum(s["tokens"] for s in splits.values()), final=True)
    if not splits["train"]["tokens"] + splits["val"]["tokens"]:
        raise CorpusError(f"{plan.name}: no text in the input")
    for s in SPLITS:  # only with too little text for even the tail's rule (a character)
        if not splits[s]["tokens"]:
            raise CorpusError(f"{plan.name}: too little text to hold any out for validation "
                              f"({splits['train']['bytes']} bytes): give more text")
    return {"format": FORMAT, "split": plan.rule.record(),
            "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "eot": tok.eot,
                          "sha256": tokenizers.fingerprint(tok), "file": "tokenizer.json",
                          "source": tokenizer_source,
                          "sample_bytes": sample_bytes if tokenizer_source == "bpe" else None},
            "dtype": np.dtype(dtype).name, "splits": splits, "skipped": plan.skipped(),
            "seconds": seconds}


def _read_ahead(plan):
    """Batches of the plan's (text, ends_document, split) of about BATCH_CHARS, read on a
    thread (file reading, JSON and hashing overlap the encoder); at most QUEUE_BATCHES wait."""
    batches, failure, stop = queue.Queue(QUEUE_BATCHES), [], threading.Event()

    def read():
        try:
            batch, size = [], 0
            for unit in plan.units():
                batch.append(unit)
                text = unit[0]
                size += len(text)
                if size >= BATCH_CHARS:
                    if not _put(batches, batch, stop):
                        return  # the consumer stopped (an error there): read no further
                    batch, size = [], 0
            if batch:
                _put(batches, batch, stop)
        except BaseException as e:  # noqa: BLE001 -- handed to the consumer, raised there
            failure.append(e)
        finally:
            _put(batches, None, stop)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        while (batch := batches.get()) is not None:
            yield batch
    finally:
        stop.set()
        thread.join()
    if failure:
        raise failure[0]


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Puts item unless the consumer has stopped; False if it has."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False

"""A text corpus named directly (`data.corpus=stdlib`, a file, a folder) is prepared on first
use into a cache and then read like any prepared folder (prepared.py): one loader.

    $TRANSFORMER_CACHE/prepared/<corpus>-<tokenizer>-<key>/    (a prepare.py folder)

The cache is `$TRANSFORMER_CACHE`, else `$XDG_CACHE_HOME/transformer`, else
`~/.cache/transformer`; deleting it (or one folder in it) is always safe: what is missing is
prepared again on the next start. The key is a hash of the text read (every unit, in order)
and of how it is tokenized and split, so the same text with the same settings is prepared
once, by the first run (or sweep member, or process) that needs it; another max_bytes, another
file's content or another tokenizer makes another folder.

What is read: the first `data.max_bytes` of UTF-8 text of the corpus's files in order (stdlib:
the standard library's .py files in sorted path order, found lazily; a folder: its files sorted,
hidden ones left out), each file read as `prepare` reads it (text, JSON Lines or Parquet by its
name) and cut into the same units: a file or record, a large text file in ~16K-character
pieces. Every start reads that text again to fingerprint it (for the quick start's 4 MB, a
few hundredths of a second); only a missing folder costs a prepare.

The split is prepare's rule (split.py): whole documents by a hash of their text (a document
over 1 MB in spans of at least 1 MB), so it does not move when more text is read; when that
leaves a split empty (a corpus of a few documents: a test's small file), the last
`val_fraction` of the text instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

from transformer.data import corpus as corpus_lib
from transformer.data import prepare, prepared, sources, split, tokenizers
from transformer.data.corpus import CorpusError

# Of the key: a change to what is read or how it is split changes it, so no set prepared by
# another version is reused. 2: one end token a document, split by document (split.py);
# 3: the tail's cut document cut in its ids, not its text (prepare.Encoder.cut).
FORMAT = 3


def root() -> Path:
    """The cache folder (TRANSFORMER_CACHE, else XDG_CACHE_HOME/transformer, else
    ~/.cache/transformer)."""
    if os.environ.get("TRANSFORMER_CACHE"):
        return Path(os.environ["TRANSFORMER_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "transformer"


class TextCorpus:
    """The units (text, ends_document) of the corpus `data.corpus` names, at most max_bytes of
    UTF-8 in all; after a full pass, `read` says how much came from how many files."""

    def __init__(self, corpus: str, max_bytes: int, text_field: str = "text", cut: bool = True,
                 anywhere: bool = False):
        self.corpus, self.max_bytes, self.field, self.cut = corpus, max_bytes, text_field, cut
        self.anywhere = anywhere  # sources.Reader's: a line with no boundary is cut anyway
        self.read, self.done = None, 0
        if corpus == "stdlib":
            self.name = "the Python standard library"
        else:
            path = Path(corpus).expanduser()
            if not path.exists():
                raise CorpusError(f"data.corpus={corpus!r}: no such file or folder (give a text "
                                  "file, a folder of text files, or stdlib/copy/random)")
            self.name = str(path)

    def _files(self):
        if self.corpus == "stdlib":
            return corpus_lib.stdlib_files()  # lazily: a run reads the first few MB of 30
        path = Path(self.corpus).expanduser()
        if path.is_dir() and not any(path.iterdir()):
            raise CorpusError(f"data.corpus={self.corpus!r}: {self.name} is empty")
        return sources.expand([str(path)])

    def units(self):
        files = self._files()
        size = used = 0
        skipped = Counter()  # sources.Reader's counts: skipped_files, bad_records
        full, unused = False, None
        for index, path in enumerate(files):
            if size >= self.max_bytes:
                full, unused = True, (len(files) - index if isinstance(files, list) else None)
                break
            reader = sources.Reader([path], self.field, self.cut, self.anywhere)
            took = False
            open_document = False  # a piece of the file was yielded and did not end it
            for text, ends in reader.units():
                raw = text.encode("utf-8", "surrogatepass")
                if size + len(raw) > self.max_bytes or (size + len(raw) == self.max_bytes
                                                        and not ends):
                    # The cut: a whole character at the end, and the document ends there (also
                    # when the budget ends with a piece, or leaves no whole character: an empty
                    # unit then ends the document its pieces began, which no unit would end).
                    raw = raw[: self.max_bytes - size].decode("utf-8", "ignore").encode()
                    text, ends, full = raw.decode(), True, True
                if text or (open_document and ends):
                    size += len(raw)
                    took = True
                    self.done = size
                    open_document = not ends
                    yield text, ends
                if full:
                    break
            skipped.update(reader.counts)
            used += took
            if full:
                unused = len(files) - index - 1 if isinstance(files, list) else None
                break
        if not size:
            # A Latin-1 file with one accented letter is text, but not UTF-8: say why it is none.
            n = skipped["skipped_files"]
            why = (f" ({n} file{'s' if n > 1 else ''} skipped: a NUL byte or bytes that are not "
                   "UTF-8 in the first 64 KB; convert text to UTF-8, e.g. iconv -f latin1 "
                   "-t utf-8)") if n else ""
            what = "holds no UTF-8 text" + why if skipped else "is empty"
            raise CorpusError(f"data.corpus={self.corpus!r}: {self.name} {what}")
        self.read = corpus_lib.Read(size, used, skipped["skipped_files"], unused, self.max_bytes,
                                    full, skipped["bad_records"])


class Plan:
    """The corpus's units with their split (prepare's (text, ends, split), split.py's rule),
    decided by a first pass (`scan`) that also fingerprints the text."""

    def __init__(self, text: TextCorpus, val_fraction: float):
        self.text, self.val_fraction = text, val_fraction
        self.name = f"data.corpus={text.corpus!r}"
        self.rule = None

    def scan(self, settings: dict) -> str:
        """Reads the corpus once: its split rule, and the key of (text, settings)."""
        self._settings = hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(),
                                         digest_size=16)
        key = self._settings.copy()
        units = _fingerprinted(self.text.units(), key)
        self.rule = split.choose(units, self.val_fraction)
        for _ in units:  # the rest of the text, for the key
            pass
        self.total, self.key = self.text.done, key.hexdigest()
        return self.key

    def units(self):
        """(text, ends, split). The text is fingerprinted again as it goes: text that changed
        since `scan` is an error before the folder is complete, so a folder always holds what
        its key says."""
        key = self._settings.copy()
        yield from self.rule.units(_fingerprinted(self.text.units(), key))
        if key.hexdigest() != self.key:
            raise CorpusError(f"{self.name}: the text changed while it was read; start again")

    def progress(self) -> tuple[int, int]:
        return self.text.done, self.total

    def skipped(self) -> dict:
        read = self.text.read  # as prepare's manifest says it
        return {k: v for k, v in (("skipped_files", read.skipped),
                                  ("bad_records", read.bad_records)) if v}


def _fingerprinted(units, key):
    """The units, each added to the fingerprint `key` as it passes."""
    for text, ends in units:
        raw = text.encode("utf-8", "surrogatepass")
        key.update(len(raw).to_bytes(8, "little"))
        key.update(raw)
        key.update(bytes([ends]))
        yield text, ends


class CachedSet(prepared.PreparedSet):
    """The prepared folder of a corpus named directly, with what was read for it."""

    def __init__(self, folder, seq_len, corpus: str, read, prepared_in: float | None):
        super().__init__(folder, seq_len)
        self.corpus, self.read, self.prepared_in = corpus, read, prepared_in

    def describe(self, config) -> str:
        how = (f"prepared just now ({self.prepared_in:.1f}s)" if self.prepared_in is not None
               else "prepared by an earlier run")
        return super().describe(config, f"{corpus_lib.describe(self.corpus, self.read)}, "
                                         f"{how} as {self.folder}")


def load(data_config, seq_len: int, tokenizer=None) -> CachedSet:
    """The cached prepared set of `data_config.corpus`, preparing it if it is not there. With
    a checkpoint's `tokenizer` (a resumed run) the set is tokenized by that one."""
    d = data_config
    # A resumed run's own tokenizer may not keep its ids where text is cut into pieces (one
    # from a Metaspace tokenizer.json): then files are read whole.
    text = TextCorpus(d.corpus, d.max_bytes,
                      cut=tokenizer is None or tokenizers.cut_keeps_ids(tokenizer),
                      anywhere=(tokenizer.kind if tokenizer else d.tokenizer) in ("byte", "char"))
    plan = Plan(text, d.val_fraction)
    settings = {"format": FORMAT, "prepare": prepare.FORMAT, "piece": sources.PIECE_CHARS,
                "span": split.SPAN_BYTES,
                "val_fraction": d.val_fraction, "tokenizer": d.tokenizer}
    if d.tokenizer == "bpe":
        settings.update(vocab_size=d.bpe_vocab_size, sample_bytes=prepare.SAMPLE_BYTES)
    key = plan.scan(settings)
    folder = _folder(d.corpus, d.tokenizer, key)
    if tokenizer is not None and not _made_by(folder, tokenizer):
        # A resumed run whose tokenizer is not (or not known to be) the one these settings
        # make (the text grew under bpe, a run from before end-of-text tokens, the cache was
        # cleared): a folder of the text encoded by the run's own tokenizer.
        spec = tokenizers.fingerprint(tokenizer)
        folder = _folder(d.corpus, tokenizer.kind,
                         hashlib.blake2b(f"{key}{spec}".encode(), digest_size=16).hexdigest())
    prepared_in = None
    if not prepared.is_prepared(folder):
        prepared_in = _prepare(folder, plan, d, tokenizer)
    try:
        return CachedSet(folder, seq_len, d.corpus, text.read, prepared_in)
    except CorpusError as e:
        raise CorpusError(str(e).replace(f"{folder}: ", f"data.corpus={d.corpus!r}: ")
                          .replace("prepare more text", "give more text")) from None


def _folder(corpus: str, kind: str, key: str) -> Path:
    name = "stdlib" if corpus == "stdlib" else Path(corpus).expanduser().name
    return root() / "prepared" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:40]}-{kind}-{key[:20]}"


def _made_by(folder: Path, tokenizer) -> bool:
    """Whether the cached `folder` exists and was tokenized by `tokenizer`."""
    return prepared.is_prepared(folder) and (
        prepared.read_manifest(folder)["tokenizer"]["sha256"] == tokenizers.fingerprint(tokenizer))


def _prepare(folder: Path, plan: Plan, d, tokenizer) -> float | None:
    """Prepares `folder` (one process at a time per host: the others wait, then read it);
    the seconds it took, or None if another process prepared it meanwhile."""
    begin, took = time.perf_counter(), None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = open(folder.parent / f".{folder.name}.lock", "w")
    except OSError as e:
        raise CorpusError(f"the data cache {folder.parent} is not writable ({e.strerror}): set "
                          "TRANSFORMER_CACHE to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not prepared.is_prepared(folder):  # not by another process meanwhile
            tok = tokenizer or prepare.build_tokenizer(
                d.tokenizer, d.bpe_vocab_size,
                lambda: prepare.training_sample(plan, prepare.SAMPLE_BYTES),
                lambda: (text for text, _, _ in plan.units()))
            learned = time.perf_counter() - begin
            extra = {"val_fraction": d.val_fraction, "inputs": [d.corpus],
                     "max_bytes": d.max_bytes, "cache": True, "command": None}
            prepare.write(folder, plan, tok, d.tokenizer, prepare.SAMPLE_BYTES, learned, extra,
                          progress=sys.stderr.isatty(), replace=False)
            took = time.perf_counter() - begin
    with contextlib.suppress(OSError):
        os.unlink(folder.parent / f".{folder.name}.lock")
    return took

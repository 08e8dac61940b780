"""Where a prepared set's documents come from: files, folders, globs and `stdlib`, read as
Parquet, JSON Lines (plain, .gz, .zst) or text, streamed one document (or piece) at a time.

    files = expand(["stdlib", "books/", "shards/*.parquet"])
    for text, ends_document in Reader(files, text_field="text").units(): ...

A document is a record, or a text file. A text file is cut into pieces of about PIECE_CHARS
characters at "x\ny" boundaries (where byte-level BPE always makes the newline a token of its
own, so the pieces encode to the file's ids; `cut=False` reads it whole, for a tokenizer where
that does not hold: tokenizers.cut_keeps_ids); a stretch with no such boundary is not cut
(`anywhere=True`, for byte and char, whose ids any cut keeps, cuts it at PIECE_CHARS); only
its last piece ends the document. A file that is not text at all (a NUL byte or no UTF-8 in
its first 64 KB: an image in a folder of texts) is skipped and counted, as is a record
without a text or whose text holds an unpaired surrogate (JSON's "\\ud800": no UTF-8 has it)
(`Reader.counts`). A damaged file is an error naming the file and the fault: a compressed
stream that is cut short or corrupt, a JSON Lines line that is not JSON or not UTF-8, an
unreadable Parquet file or one with a text that is not UTF-8, a text file that stops being
UTF-8; and so is a wrong text field,
naming the fields there are (docs/data.md).
"""

from __future__ import annotations

import codecs
import glob
import gzip
import json
import os
import re
import zlib
from collections import Counter
from pathlib import Path

from transformer.data import corpus
from transformer.data.corpus import CorpusError

PIECE_CHARS = 16_384  # text files are cut into pieces of about this many characters


def expand(inputs) -> list[Path]:
    """The files named by `inputs` (files, folders, globs, `stdlib`), in order, each once."""
    files = []
    for spec in inputs:
        if spec == "stdlib":
            files += list(corpus.stdlib_files())
            continue
        spec = os.path.expanduser(spec)
        if glob.has_magic(spec):
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise CorpusError(f"{spec}: no file matches")
        else:
            matches = [spec]
        for match in map(Path, matches):
            if match.is_dir():
                files += sorted(_files_under(match))
            elif match.is_file():
                files.append(match)
            else:
                raise CorpusError(f"{match}: no such file or folder "
                                  "(give files, folders, globs or stdlib)")
    files = list(dict.fromkeys(files))
    if not files:
        raise CorpusError(f"{' '.join(inputs)}: no input files")
    return files


def _files_under(folder: Path):
    """Every file under `folder`, less hidden files and folders and the prepared datasets
    inside it (a set prepared into a folder of its own inputs: a later prepare read its
    manifest.json and tokenizer.json as documents)."""
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")
                   and not is_prepared_folder(Path(root) / d)]
        yield from (Path(root) / n for n in names
                    if not n.startswith(".") and (Path(root) / n).is_file())


def is_prepared_folder(folder: Path) -> bool:
    """A folder that `prepare` wrote: its manifest.json is a JSON object with the format and
    the splits (a manifest.json of some other kind is a document like any other)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"format", "splits", "tokenizer"} <= manifest.keys()


def kind_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if re.search(r"\.(jsonl|ndjson)(\.gz|\.zst)?$", name):
        return "jsonl"
    return "text"


class Reader:
    """The units of the inputs in order: (text, ends_document). A unit is a record, a small
    text file, or a piece of a large one. `done` is the input bytes consumed so far."""

    def __init__(self, files: list[Path], text_field: str = "text", cut: bool = True,
                 anywhere: bool = False):
        self.files, self.field, self.cut, self.anywhere = files, text_field, cut, anywhere
        self.total = sum(p.stat().st_size for p in files)
        self.done = 0
        self.counts = Counter()  # skipped_files, bad_records (see docs/data.md)

    def units(self):
        for path in self.files:
            start, size = self.done, path.stat().st_size
            read = {"text": self._text, "jsonl": self._jsonl, "parquet": self._parquet}
            try:
                yield from read[kind_of(path)](path, start)
            except (OSError, EOFError, zlib.error) as e:  # unreadable; a cut or corrupt .gz
                raise CorpusError(f"{path}: {' '.join(str(e).split()) or type(e).__name__}"
                                  ) from None
            self.done = start + size

    def _text(self, path: Path, start: int):
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
            if not raw:
                return
            if b"\0" in raw or _decode_head(raw) is None:
                self.counts["skipped_files"] += 1  # binary, or not UTF-8
                return
            decoder = codecs.getincrementaldecoder("utf-8")()

            def decode(raw: bytes, final: bool = False) -> str:
                try:
                    return decoder.decode(raw, final)
                except UnicodeDecodeError as e:
                    at = f.tell() - len(raw) + max(e.start, 0)
                    raise CorpusError(f"{path}: not UTF-8 text near byte {at:,} ({e.reason}): "
                                      "damaged, or in another encoding") from None
            if not self.cut:  # the file whole, one unit
                parts = []
                while raw:
                    parts.append(decode(raw))
                    self.done = start + f.tell()
                    raw = f.read(1 << 20)
                yield "".join(parts) + decode(b"", final=True), True
                return
            buf, pos = "", 0  # pieces are taken from pos on: the ~1 MB buffer is not copied
            rest, tail = [], ""  # read past a line with no boundary yet (joined at one)
            while raw:        # once per piece, only once per read
                text = decode(raw)
                self.done = start + f.tell()
                raw = f.read(1 << 20)
                if rest or tail:  # waiting for a boundary: the new text is only searched
                    rest.append(text)
                    if not _BOUNDARY.search(tail + text):
                        tail = (tail + text)[-2:] or tail
                        continue
                    text, rest, tail = "".join(rest), [], ""
                buf = buf[pos:] + text
                pos = 0
                while len(buf) - pos >= 2 * PIECE_CHARS:
                    cut = _cut(buf, PIECE_CHARS, pos)
                    if cut is None and self.anywhere:
                        cut = pos + PIECE_CHARS
                    if cut is None:  # no boundary in the buffer: read on until there is one
                        tail = buf[-2:]
                        break
                    yield buf[pos:cut], False
                    pos = cut
            yield buf[pos:] + "".join(rest) + decode(b"", final=True), True

    def _jsonl(self, path: Path, start: int):
        with open(path, "rb") as raw:
            name = path.name.lower()
            if name.endswith(".gz"):
                stream = gzip.GzipFile(fileobj=raw)
            elif name.endswith(".zst"):
                stream = _zstd_lines(raw, path)
            else:
                stream = raw
            first = True
            for n, line in enumerate(stream, 1):
                if n % 4096 == 0:
                    self.done = start + raw.tell()
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except UnicodeDecodeError as e:
                    raise CorpusError(f"{path}: line {n:,} is not UTF-8 ({e.reason} at byte "
                                      f"{e.start} of the line)") from None
                except ValueError as e:
                    raise CorpusError(f"{path}: line {n:,} is not JSON ({e}): damaged or cut "
                                      "short") from None
                text = record.get(self.field) if isinstance(record, dict) else None
                if first and not (isinstance(record, dict) and self.field in record):
                    # The first record decides a wrong --text_field (a null text is a bad record)
                    have = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                    raise CorpusError(f"{path}: line {n:,} has no {self.field!r} field (it has: "
                                      f"{have}); pass --text_field=NAME")
                first = False
                if not isinstance(text, str) or (_SURROGATE.search(line)
                                                 and not _is_unicode(text)):
                    self.counts["bad_records"] += 1  # not a string; an unpaired surrogate
                    continue
                if text:
                    yield text, True

    def _parquet(self, path: Path, start: int):
        import pyarrow
        import pyarrow.parquet as pq
        try:
            pf = pq.ParquetFile(path, pre_buffer=False)  # less held at once (docs/data.md)
            names = pf.schema_arrow.names
            if self.field not in names:
                raise CorpusError(f"{path}: no {self.field!r} column (it has: "
                                  f"{', '.join(names)}); pass --text_field=NAME")
            rows, size, done = max(1, pf.metadata.num_rows), path.stat().st_size, 0
            # Row group by row group, 256 rows at a time turned into Python strings (a whole
            # row group of them at once peaked at 677 MB RSS on a 240 MB set, against 410 MB).
            for batch in pf.iter_batches(batch_size=256, columns=[self.field]):
                for text in _strings(batch.column(0), path, done):
                    if isinstance(text, str) and text:
                        yield text, True
                    else:
                        self.counts["bad_records"] += 1
                done += batch.num_rows
                self.done = start + size * done // rows
        except pyarrow.ArrowException as e:
            raise CorpusError(f"{path}: not a readable Parquet file: "
                              f"{' '.join(str(e).split())}") from None


def _strings(column, path: Path, first_row: int) -> list:
    """A Parquet column's values as Python objects; a string that is not UTF-8 (pyarrow
    checks none that it reads: a writer other than Arrow can store any bytes) is an error
    naming the file and its row (counted from 1)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError as e:
        for k in range(len(column)):
            try:
                column[k].as_py()
            except UnicodeDecodeError:
                raise CorpusError(f"{path}: row {first_row + k + 1:,} is not UTF-8 ({e.reason}): "
                                  "damaged, or written in another encoding") from None
        raise


def _zstd_lines(raw, path: Path):
    """The lines of a zstandard file, frame after frame; a file cut short in a frame (which
    the library's stream reader ends silently) or corrupt is an error naming it."""
    try:
        import zstandard
    except ImportError:
        raise CorpusError(f"{path}: reading .zst needs the zstandard package "
                          "(pip install zstandard)") from None
    context = zstandard.ZstdDecompressor()
    frame, fed, tail = context.decompressobj(), False, b""
    try:
        while chunk := raw.read(1 << 20):
            while chunk:
                if frame.eof:  # the next frame
                    frame, fed = context.decompressobj(), False
                fed = True
                tail += frame.decompress(chunk)
                chunk = frame.unused_data if frame.eof else b""
            *lines, tail = tail.split(b"\n")
            for line in lines:
                yield line + b"\n"
    except zstandard.ZstdError as e:
        raise CorpusError(f"{path}: corrupt zstandard data ({e})") from None
    if fed and not frame.eof:
        raise CorpusError(f"{path}: the zstandard stream is cut short (its last frame is "
                          "incomplete)")
    if tail:
        yield tail


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSON escape of a surrogate (\ud800)


def _is_unicode(text: str) -> bool:
    """Whether `text` is Unicode text: JSON's "\\ud800" alone (an unpaired surrogate, which
    JSON allows) is not, and has no UTF-8: no tokenizer can encode it, and the byte tokenizer
    would store bytes that no UTF-8 text holds."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _decode_head(raw: bytes):
    """raw as UTF-8, allowing its last character to be cut short; None if it is not UTF-8."""
    for cut in range(min(4, len(raw))):
        try:
            return raw[: len(raw) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


_BOUNDARY = re.compile(r"(?<=\S\n)(?=\S)")


def _cut(text: str, target: int, start: int = 0) -> int | None:
    """Where to end the piece of `text` that begins at `start`: the last "x\ny" boundary
    (a newline between two non-space characters) before start + target (in the piece's
    second half), else the first after it, else None (no boundary: a cut anywhere else can
    change a BPE's ids, so the reader reads on). Found with rfind from the end: the regex's
    forward scan of the whole half cost more than reading the file."""
    lo, hi = start + target // 2, start + target
    newline = text.rfind("\n", lo - 1, hi - 1)
    while newline >= lo - 1:
        p = newline + 1  # the boundary would be just after the newline
        if p >= 2 and not text[p - 2].isspace() and not text[p].isspace():
            return p
        newline = text.rfind("\n", lo - 1, newline)
    m = _BOUNDARY.search(text, hi)
    return m.start() if m else None

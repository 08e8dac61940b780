"""Which text is held out for validation: one rule, for `prepare` and for the cache alike.

    rule = split.choose(units, val_fraction)          # reads only until both splits have text
    for text, ends_document, name in rule.units(units): ...   # name: "train" or "val"

By document. A document (a file, a JSON Lines record, a Parquet row) goes to validation whole
when the first 8 bytes of the BLAKE2b hash of its text, as a fraction of 2^64, fall below
`val_fraction` (`is_val`): the split depends on the document's text alone, so adding data never
moves one, and a piece of a file (a unit of reading) is never held out apart from the rest of
its file, one line away from text that is trained on. A document over SPAN_BYTES of UTF-8 is
hashed in consecutive spans of at least SPAN_BYTES (cut where the reader cuts pieces; a short
rest at its end joins the span before it), so one large file (a novel, a dump) still yields
validation text, and held-out text touches trained text only at a span's two edges.

The tail. When that leaves a split empty (a corpus of a few documents: one small file), the
last `val_fraction` of the text's UTF-8 bytes is held out instead, as one contiguous span, cut
at the first line boundary ("x\\ny", where the reader cuts pieces) after that point, or at the
point itself when its document has none there.
"""

from __future__ import annotations

import hashlib
import math
import re

SPAN_BYTES = 1 << 20  # a document longer than this is held out in spans at least this long
_LINE = re.compile(r"(?<=\S\n)(?=\S)")  # the reader's piece boundary (sources.py)


def is_val(text: str | bytes, val_fraction: float) -> bool:
    """The split of a document (or span): the first 8 bytes of the BLAKE2b hash of its UTF-8
    (`text`, or already encoded) as a fraction of 2^64. Depends on the text alone, so adding
    documents never moves one (and a larger fraction only moves training documents into
    validation)."""
    raw = text if isinstance(text, bytes) else _utf8(text)
    return _below(hashlib.blake2b(raw, digest_size=8), val_fraction)


def _below(digest, val_fraction: float) -> bool:
    return int.from_bytes(digest.digest(), "little") < val_fraction * 2.0**64


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Split:
    """A rule applied to a stream of units (text, ends_document): by document (`tail_from` None)
    or the tail (validation from byte `tail_from` of the text on). After `units` has run,
    `cut` counts the documents held out in spans."""

    def __init__(self, val_fraction: float, tail_from: int | None = None, total: int = 0):
        self.val_fraction, self.tail_from, self.total = val_fraction, tail_from, total
        self.rule = "documents" if tail_from is None else "tail"
        self.cut = 0

    def units(self, units):
        """(text, ends_document, split) for every unit, in order; the tail rule cuts the unit
        where validation begins in two."""
        self.cut = 0
        return self._by_document(units) if self.tail_from is None else self._tail(units)

    def _by_document(self, units):
        held, size, digest, before, spans = [], 0, _digest(), None, 0
        for text, ends in units:
            raw = _utf8(text)
            held.append(text)
            size += len(raw)
            digest.update(raw)
            if not ends and size < SPAN_BYTES:
                continue  # a span is only decided when it is whole (memory: one span)
            if before is not None and ends and size < SPAN_BYTES:
                split = before  # the short rest of a long document joins its last span
            else:
                split = "val" if _below(digest, self.val_fraction) else "train"
                spans += 1
            for t in held[:-1]:
                yield t, False, split
            yield held[-1], ends, split
            held, size, digest = [], 0, _digest()
            if ends:
                self.cut += spans > 1
                before, spans = None, 0
            else:
                before = split

    def _tail(self, units):
        at = 0
        for text, ends in units:
            n = len(_utf8(text))
            if at + n <= self.tail_from:
                yield text, ends, "train"
            elif at >= self.tail_from:
                yield text, ends, "val"
            else:
                i = _cut(text, self.tail_from - at)
                if i > 0:
                    yield text[:i], False, "train"
                yield text[i:], ends, "val"
            at += n

    def record(self) -> dict:
        """The rule, for the manifest (the run's data line says it: `describe`)."""
        out = {"rule": self.rule, "val_fraction": self.val_fraction}
        if self.rule == "documents":
            out.update(span_bytes=SPAN_BYTES, documents_in_spans=self.cut)
        else:
            out.update(val_from_byte=self.tail_from, of_bytes=self.total)
        return out


def _digest():
    return hashlib.blake2b(digest_size=8)


def _cut(text: str, byte: int) -> int:
    """The character index where validation begins in `text`: the first line boundary at or
    after UTF-8 byte `byte`, else that byte's character (validation keeps at least one)."""
    i = len(_utf8(text)[:byte].decode("utf-8", "ignore"))  # a cut character goes to val
    m = _LINE.search(text, i)
    return m.start() if m and m.start() < len(text) else i


def choose(units, val_fraction: float) -> Split:
    """The rule for a corpus: by document, unless that leaves a split empty (then the tail).
    Reads `units` only until both splits have text, so a large corpus decides at once; a
    small one is read to its end (the tail needs its length)."""
    seen, total = set(), 0
    for text, _, split in Split(val_fraction).units(units):
        seen.add(split)
        total += len(_utf8(text))
        if len(seen) == 2:
            return Split(val_fraction)
    need = min(max(1, math.ceil(val_fraction * total)), total - 1)
    return Split(val_fraction, tail_from=total - max(need, 0), total=total)


def describe(record: dict | None, val: dict, total_bytes: int) -> str:
    """The split for the run's data line: which rule, and how much it held out."""
    share = f"{val['bytes'] / max(1, total_bytes):.1%} of the text"
    if record is None:  # a folder from before this rule
        return (f"val: pieces by hash ({share}; prepared by an older version, whose validation "
                "can share files with training: prepare it again)")
    if record["rule"] == "tail":
        return (f"val: the last {share} (too few documents to hold out whole ones)")
    spans = record.get("documents_in_spans", 0)
    if spans:
        return (f"val: whole documents by hash, the {spans:,} over "
                f"{record['span_bytes'] / 2**20:g} MB in spans of at least that "
                f"({val['parts']:,} parts, {share})")
    return f"val: whole documents by hash ({val['documents']:,} documents, {share})"

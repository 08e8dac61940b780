"""Prepared datasets (transformer/data/prepare.py, prepared.py): what goes into the shards is the
saved tokenizer's own encoding of each document plus the end-of-text token, whatever the input
format; the split is by document and stable as data is added; a prepare that fails or is
killed leaves nothing trainable; bad input is one line; batches from a prepared folder are a
pure function of (seed, split, index, row), one epoch visits every window once, and a run
killed with SIGKILL resumes on it bit for bit."""

from __future__ import annotations

import gzip
import json
import math
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, fork_popen, run_cli
from transformer import config as config_lib
from transformer import data
from transformer.data import prepare as prep
from transformer.data import prepared, tokenizers
from transformer.data.corpus import CorpusError

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards hex jolly boxes "
         "déjà vu 中文 naïve\tdef f(x):\n    return x").split(" ")


def documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 60))) + rng.choice([".", "\n", ".\n"])
            for _ in range(n)]  # never empty: an empty document is left out


def write_inputs(folder: Path, docs: list[str], field: str = "text") -> list[Path]:
    """docs spread over Parquet, JSONL (plain, .gz, .zst) and text files, in this order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    folder.mkdir(parents=True, exist_ok=True)
    parts = np.array_split(np.arange(len(docs)), 5)
    take = lambda i: [docs[j] for j in parts[i]]  # noqa: E731
    paths = [folder / "a.parquet", folder / "b.jsonl", folder / "c.jsonl.gz",
             folder / "d.jsonl.zst", folder / "e"]
    pq.write_table(pa.table({"id": list(range(len(parts[0]))), field: take(0)}), paths[0],
                   row_group_size=7)
    lines = lambda i: "".join(json.dumps({"id": 1, field: d}) + "\n" for d in take(i))  # noqa
    paths[1].write_text(lines(1))
    paths[2].write_bytes(gzip.compress(lines(2).encode()))
    paths[3].write_bytes(zstandard.ZstdCompressor().compress(lines(3).encode()))
    paths[4].mkdir(exist_ok=True)
    for k, d in enumerate(take(4)):  # a folder of text files, one document each
        (paths[4] / f"{k:04d}.txt").write_text(d)
    return paths


def read_split(folder: Path, split: str) -> list[np.ndarray]:
    """The split's pieces (documents here), as written."""
    manifest = prepared.read_manifest(folder)
    out = []
    for shard in manifest["splits"][split]["shards"]:
        tokens = np.fromfile(folder / shard["file"], dtype=manifest["dtype"])
        ends = np.load(folder / shard["file"].replace(".bin", ".ends.npy"))
        out += np.split(tokens, ends[:-1])
    return out


def decoded_split(folder: Path, split: str) -> list[str]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tok.decode(ids[:-1].tolist()) for ids in read_split(folder, split)]


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_shards_hold_the_saved_tokenizers_encoding_plus_end_of_text(kind, tmp_path):
    from tokenizers import Tokenizer
    docs = documents(120, seed=1)
    docs[3] += " <|endoftext|> inside a document"  # text, as any other
    inputs = write_inputs(tmp_path / "in", docs)
    out = tmp_path / "set"
    manifest = prep.prepare(inputs, out, tokenizer=kind, vocab_size=300, val_fraction=0.2)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eot = manifest["tokenizer"]["eot"]
    assert tok.token_to_id(tokenizers.EOT) == eot == manifest["tokenizer"]["vocab_size"] - 1
    as_text = tokenizers.ordinary(tok)
    for split in ("train", "val"):
        expected = [as_text.encode(d, add_special_tokens=False).ids + [eot] for d in docs
                    if prep.is_val(d, 0.2) == (split == "val")]
        got = [ids.tolist() for ids in read_split(out, split)]
        assert got == expected
        assert manifest["splits"][split]["documents"] == len(expected)
    assert manifest["dtype"] == "uint16"
    assert [s["path"] for s in manifest["sources"]][:4] == [str(p) for p in inputs[:4]]
    # The folder loads (its tokenizer.json matches the manifest's hash), and the tokenizer a
    # checkpoint saves comes back as the same one (what a resumed run is checked against).
    loaded = prepared.PreparedSet(out, 8).tokenizer
    assert loaded.kind == kind and loaded.eot == eot
    assert tokenizers.fingerprint(tokenizers.from_json(loaded.to_json())) == \
        tokenizers.fingerprint(loaded) == manifest["tokenizer"]["sha256"]


def test_every_document_ends_once_and_its_stored_ids_are_its_whole_encoding(tmp_path):
    """A piece of a file is a unit of reading only: each document (a text file of several
    pieces, a JSON Lines record) is stored whole in one split, as its whole encoding followed by
    exactly one end-of-text token, and the folder's ends mark documents, not pieces."""
    from tokenizers import Tokenizer

    from transformer.data.sources import PIECE_CHARS
    big = [("".join(documents(400, seed=100 + k))) for k in range(8)]  # ~60K chars: 3+ pieces
    assert all(len(d) > 3 * PIECE_CHARS for d in big)
    small = documents(40, seed=13)
    (tmp_path / "small.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in small))
    (tmp_path / "big").mkdir()
    for k, d in enumerate(big):
        (tmp_path / "big" / f"{k}.txt").write_text(d)
    assert {prep.is_val(d, 0.3) for d in big} == {True, False}  # large files in both splits
    out = tmp_path / "set"
    manifest = prep.prepare([tmp_path / "small.jsonl", tmp_path / "big"], out, tokenizer="bpe",
                            vocab_size=400, val_fraction=0.3)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eot = manifest["tokenizer"]["eot"]
    for split in ("train", "val"):
        expected = [tok.encode(d).ids + [eot] for d in small + big
                    if prep.is_val(d, 0.3) == (split == "val")]
        assert [a.tolist() for a in read_split(out, split)] == expected
        stored = np.concatenate(read_split(out, split))
        assert (stored == eot).sum() == len(expected) == manifest["splits"][split]["documents"]
    assert manifest["split"]["rule"] == "documents"


def test_a_text_file_without_line_boundaries_is_stored_as_its_whole_encoding(tmp_path):
    """Text with no "x\ny" boundary to cut a piece at (CRLF line ends; one-line paragraphs
    between blank lines) is not cut elsewhere, mid-word, for a BPE: every long file's stored ids
    are its whole encoding and one end token, for a learned BPE and for a tokenizer.json whose
    check passed on a file that has such boundaries."""
    from tokenizers import Tokenizer

    from transformer.data.sources import PIECE_CHARS
    flat = lambda seed: [d.replace("\n", " ").strip() for d in documents(400, seed)]  # noqa
    plain = "".join(documents(500, seed=30))  # boundaries: the given tokenizer's check passes
    crlf = ["\r\n".join(flat(31 + k)) + "\r\n" for k in range(3)]
    paragraphs = ["\n\n".join(flat(41 + k)) + "\n" for k in range(3)]
    docs = [plain] + crlf + paragraphs
    assert all(len(d) > 2 * PIECE_CHARS for d in docs)
    (tmp_path / "in").mkdir()
    for k, d in enumerate(docs):
        (tmp_path / "in" / f"{k}.txt").write_bytes(d.encode())
    small = documents(40, seed=13)  # enough documents to split by document
    (tmp_path / "in" / "small.jsonl").write_text("".join(json.dumps({"text": d}) + "\n"
                                                         for d in small))
    _authors_tokenizer("bytelevel", docs, tmp_path / "tokenizer.json")
    for kind in ("bpe", str(tmp_path / "tokenizer.json")):
        out = tmp_path / "set"
        manifest = prep.prepare([tmp_path / "in"], out, tokenizer=kind, vocab_size=400,
                                val_fraction=0.3, overwrite=True)
        assert manifest["text_in_pieces"] and manifest["split"]["rule"] == "documents"
        tok = tokenizers.ordinary(Tokenizer.from_file(str(out / "tokenizer.json")))
        eot = manifest["tokenizer"]["eot"]
        stored = [a.tolist() for split in ("train", "val") for a in read_split(out, split)]
        want = [tok.encode(d, add_special_tokens=False).ids + [eot] for d in docs + small]
        assert sorted(stored) == sorted(want), kind


def test_a_given_tokenizer_is_checked_on_pieces_of_the_first_file_that_has_them(tmp_path):
    """The pieces a tokenizer.json is checked on come from the first long text file that is
    cut at all: one with no line boundary (read whole, one piece) is passed over."""
    flat = "\r\n".join(d.replace("\n", " ") for d in documents(800, seed=24))
    lines = "".join(documents(800, seed=25))
    (tmp_path / "a.txt").write_text(flat, newline="")
    (tmp_path / "b.txt").write_text(lines)
    pieces = prep.first_pieces([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert len(pieces) > 1 and lines.startswith("".join(pieces))


def test_a_line_longer_than_several_reads_is_one_piece_and_the_rest_is_cut_as_before(
        tmp_path):
    """The reader reads on past a line longer than its 1 MB reads to the next "x\ny"
    boundary: the pieces are the file, each ends at a boundary, and after the long line
    pieces are ~16K again; with anywhere=True (byte, char) it is cut anyway: no piece is
    longer than a read and its rest."""
    import re

    from transformer.data.sources import PIECE_CHARS, Reader
    lines = "".join(documents(3000, seed=28))
    text = lines[:50_000] + "word " * 600_000 + "end\n" + lines
    (tmp_path / "a.txt").write_text(text)
    pieces = [t for t, _ in Reader([tmp_path / "a.txt"]).units()]
    assert "".join(pieces) == text
    boundary = re.compile(r"(?<=\S\n)(?=\S)")
    at = 0
    for piece in pieces[:-1]:
        at += len(piece)
        assert boundary.match(text, at), at
    assert max(len(p) for p in pieces) > 3_000_000
    assert sum(len(p) < 2 * PIECE_CHARS for p in pieces) >= len(pieces) - 2
    cut = [t for t, _ in Reader([tmp_path / "a.txt"], anywhere=True).units()]
    assert "".join(cut) == text and max(len(p) for p in cut) < (1 << 20) + 2 * PIECE_CHARS


def test_the_bpe_sample_stays_its_size_when_a_file_is_one_long_line():
    """The training sample BPE learns from is at most sample_bytes of text, even where a
    single unit (a file with no line boundary, read whole) is larger."""
    class Plan:
        def units(self):
            yield "x" * 10, True, "train"
            yield "y" * 1000, True, "val"
            yield "z" * 5000, True, "train"
            yield "w" * 10, True, "train"
    assert list(prep.training_sample(Plan(), 100)) == ["x" * 10, "z" * 90]


def test_a_document_over_the_span_size_is_held_out_in_long_contiguous_spans(tmp_path,
                                                                             monkeypatch):
    """One large file (scaled down: spans of 64 KiB for a ~700 KB file): validation is whole
    spans of at least the span size, each a contiguous stretch of the file; in file order the
    parts are the file, and the data line says what was held out."""
    from transformer.data import split
    monkeypatch.setattr(split, "SPAN_BYTES", 1 << 16)
    text = "".join(documents(4500, seed=2))
    (tmp_path / "big.txt").write_text(text)
    out = tmp_path / "set"
    manifest = prep.prepare([tmp_path / "big.txt"], out, val_fraction=0.3)
    parts = {s: [bytes(a[a != 256].astype(np.uint8)).decode() for a in read_split(out, s)]
             for s in ("train", "val")}
    assert parts["val"] and parts["train"]
    every = sorted((text.index(p), p) for s in parts for p in parts[s])
    assert "".join(p for _, p in every) == text  # contiguous, in order, nothing lost
    assert all(len(p.encode()) >= 1 << 16 for _, p in every)
    assert manifest["split"] == {"rule": "documents", "val_fraction": 0.3,
                                 "span_bytes": 1 << 16, "documents_in_spans": 1}
    line = prepared.PreparedSet(out, 16).describe(config_lib.base_config())
    assert "val: whole documents by hash, the 1 over 0.0625 MB in spans of at least that" in line


def test_a_single_small_file_is_split_as_the_cache_splits_it(tmp_path, monkeypatch):
    """One rule: the text `prepare` would refuse for want of documents is what a run on the same
    file named directly trains on: its tail is held out, in both, token for token."""
    from test_cache import config_for
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    text = "".join(documents(40, seed=14))
    (tmp_path / "one.txt").write_text(text)
    manifest = prep.prepare([tmp_path / "one.txt"], tmp_path / "set", val_fraction=0.1)
    config = config_for(tmp_path / "one.txt")
    config.data.val_fraction = 0.1
    _, source = data.load(config)
    for split in ("train", "val"):
        assert [a.tolist() for a in read_split(tmp_path / "set", split)] == \
            [a.tolist() for a in read_split(source.folder, split)]
    train, val = (np.concatenate(read_split(tmp_path / "set", s)) for s in ("train", "val"))
    assert 256 not in train and val.tolist().count(256) == 1 and val[-1] == 256  # one document
    train, val = (bytes(a[a != 256].astype(np.uint8)).decode() for a in (train, val))
    need = math.ceil(0.1 * len(text.encode()))
    assert train + val == text and manifest["split"]["rule"] == "tail"
    assert 0 < len(val.encode()) <= need and (len(val.encode()) == need or train.endswith("\n"))
    assert "val: the last" in source.describe(config)


def _with_val(config, fraction):
    config.data.val_fraction = fraction
    return config


def test_no_validation_document_is_a_training_document_and_the_fraction_holds(tmp_path):
    docs = list(dict.fromkeys(documents(3000, seed=3)))  # distinct texts
    inputs = write_inputs(tmp_path / "in", docs)
    manifest = prep.prepare(inputs, tmp_path / "set", val_fraction=0.2)
    train, val = (set(decoded_split(tmp_path / "set", s)) for s in ("train", "val"))
    assert not train & val
    assert train | val == set(docs)
    n_val = manifest["splits"]["val"]["documents"]
    assert abs(n_val - 0.2 * len(docs)) < 4 * (0.2 * 0.8 * len(docs)) ** 0.5  # 4 sigma


def test_more_data_keeps_every_earlier_validation_document_in_validation(tmp_path):
    first = write_inputs(tmp_path / "first", documents(400, seed=4))
    more = write_inputs(tmp_path / "more", documents(400, seed=5))
    prep.prepare(first, tmp_path / "small", val_fraction=0.1)
    prep.prepare([*first, *more], tmp_path / "large", val_fraction=0.1)
    small_val = set(decoded_split(tmp_path / "small", "val"))
    large_val = set(decoded_split(tmp_path / "large", "val"))
    large_train = set(decoded_split(tmp_path / "large", "train"))
    assert small_val and small_val <= large_val and not small_val & large_train
    assert len(large_val) > len(small_val)


def test_an_out_folder_inside_the_input_is_not_read_as_input(tmp_path):
    """Preparing a folder into a folder inside it, again with --overwrite, gives the same set:
    the files of the folder being replaced (its manifest.json, tokenizer.json, shards) are
    never documents of the new one."""
    docs = documents(60, seed=22)
    (tmp_path / "in").mkdir()
    for k, d in enumerate(docs):
        (tmp_path / "in" / f"{k:03d}.txt").write_text(d)
    out = tmp_path / "in" / "prepared"
    first = prep.prepare([tmp_path / "in"], out, val_fraction=0.2)
    stored = {s: [a.tolist() for a in read_split(out, s)] for s in ("train", "val")}
    again = prep.prepare([tmp_path / "in"], out, val_fraction=0.2, overwrite=True)
    assert {s: [a.tolist() for a in read_split(out, s)] for s in ("train", "val")} == stored
    assert again["splits"] == first["splits"] and again["skipped"] == {}
    with pytest.raises(CorpusError, match="no input files outside --out"):
        prep.prepare([out], out, overwrite=True)


def test_a_prepared_set_inside_an_input_folder_is_not_read_as_text(tmp_path):
    """A set prepared into a folder of its inputs earlier (not this --out) is left out of a
    later prepare of that folder: its tokens are those of the text files alone (its manifest
    and tokenizer.json were documents, its shards skipped files). A manifest.json of another
    kind is a document; a prepared set named as an input is refused in one line."""
    docs = documents(30, seed=23)
    (tmp_path / "in" / "notes").mkdir(parents=True)
    for k, d in enumerate(docs):
        (tmp_path / "in" / f"{k:03d}.txt").write_text(d)
    (tmp_path / "in" / "notes" / "manifest.json").write_text('{"name": "my notes"}\n')
    plain = prep.prepare([tmp_path / "in"], tmp_path / "plain", val_fraction=0.2)
    prep.prepare([tmp_path / "in"], tmp_path / "in" / "old", val_fraction=0.2)
    again = prep.prepare([tmp_path / "in"], tmp_path / "new", val_fraction=0.2)
    assert [s["path"] for s in again["sources"]] == [s["path"] for s in plain["sources"]]
    assert any(s["path"].endswith("notes/manifest.json") for s in plain["sources"])
    for s in ("train", "val"):
        assert [a.tolist() for a in read_split(tmp_path / "new", s)] == \
            [a.tolist() for a in read_split(tmp_path / "plain", s)]
    with pytest.raises(CorpusError, match=r"old is a prepared dataset .*not text"):
        prep.prepare([tmp_path / "in" / "old"], tmp_path / "other")


def test_overwrite_of_the_current_folder_given_as_dot_replaces_it(tmp_path, monkeypatch):
    """--out=. from inside a prepared folder, with --overwrite, leaves the new set there,
    complete (before: the old set deleted, the new one with it, and a traceback)."""
    (tmp_path / "in").mkdir()
    for k, d in enumerate(documents(60, seed=27)):
        (tmp_path / "in" / f"{k:03d}.txt").write_text(d)
    prep.prepare([tmp_path / "in"], tmp_path / "set", val_fraction=0.2)
    stored = {s: [a.tolist() for a in read_split(tmp_path / "set", s)] for s in ("train", "val")}
    monkeypatch.chdir(tmp_path / "set")
    prep.prepare([tmp_path / "in"], ".", val_fraction=0.2, overwrite=True)
    assert {s: [a.tolist() for a in read_split(tmp_path / "set", s)]
            for s in ("train", "val")} == stored
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_failed_prepare_leaves_no_folder(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents(50, seed=6)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(CorpusError, match="no 'text' field.*body"):
        prep.prepare([good, bad], tmp_path / "set")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl"]


def test_a_killed_prepare_leaves_nothing_that_trains(tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        for d in documents(20000, seed=7) * 3:  # ~5 MB, seconds with bpe
            f.write(json.dumps({"text": d}) + "\n")
    out = tmp_path / "set"
    proc = fork_popen(["-m", "transformer", "prepare", big, f"--out={out}", "--tokenizer=bpe",
                       "--vocab_size=2000", "--sample_bytes=300000", "--noprogress"], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".set.partial") and any(p.glob("train_*.bin"))
                  for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "prepare ended too soon"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists() and not prepared.is_prepared(out)
    partial = [p for p in tmp_path.iterdir() if p.name.startswith(".set.partial")]
    assert partial and not prepared.is_prepared(partial[0])  # no manifest: not a dataset


# (what, inputs and flags, phrase of the one error line); {T}: the test's folder
BAD = [
    ("missing path", ["{T}/nothing.txt", "--out={T}/o1"], "no such file"),
    ("glob matching nothing", ["{T}/*.nothing", "--out={T}/o2"], "no file matches"),
    ("jsonl without the field", ["{T}/fields.jsonl", "--out={T}/o3"], "it has: title, body"),
    ("parquet without the field", ["{T}/fields.parquet", "--out={T}/o4"], "it has: title, body"),
    ("empty input", ["{T}/empty.txt", "--out={T}/o5"], "no text"),
    ("out exists", ["{T}/doc.txt", "--out={T}/exists"], "--overwrite"),
    ("overwrite what is not a dataset", ["{T}/doc.txt", "--out={T}/notes", "--overwrite"],
     "not a prepared dataset"),
    ("out under a file", ["{T}/doc.txt", "--out={T}/doc.txt/o"], "doc.txt is a file"),
    ("unknown tokenizer", ["{T}/doc.txt", "--out={T}/o6", "--tokenizer=bytes"],
     "expected byte, char, bpe or a tokenizer.json"),
    ("no inputs", ["--out={T}/o7"], "INPUT"),
    ("no --out", ["{T}/doc.txt"], "--out"),
    ("not a tokenizer file", ["{T}/doc.txt", "--out={T}/o8", "--tokenizer={T}/doc.txt"],
     "not a tokenizers file"),
    # BPE learned from no text: a tokenizer of bytes alone, written without a word.
    ("bpe from no sample", ["{T}/doc.txt", "--out={T}/o9", "--tokenizer=bpe", "--sample_bytes=0"],
     "--sample_bytes=0"),
    # Damaged files (planted by damage_files): the file and the fault, no folder.
    ("a .gz cut short", ["{T}/cut.jsonl.gz", "--out={T}/d1"],
     "cut.jsonl.gz: Compressed file ended before the end-of-stream marker"),
    ("a .gz with corrupt data", ["{T}/corrupt.jsonl.gz", "--out={T}/d2"], "corrupt.jsonl.gz: "),
    ("a .zst cut short", ["{T}/cut.jsonl.zst", "--out={T}/d3"],
     "cut.jsonl.zst: the zstandard stream is cut short"),
    ("a .zst with corrupt data", ["{T}/corrupt.jsonl.zst", "--out={T}/d4"],
     "corrupt.jsonl.zst: corrupt zstandard data"),
    ("a JSON Lines line that is not JSON", ["{T}/cut.jsonl", "--out={T}/d5"],
     "cut.jsonl: line 30 is not JSON"),
    ("a JSON Lines line that is not UTF-8", ["{T}/latin1.jsonl", "--out={T}/d6"],
     "latin1.jsonl: line 2 is not UTF-8"),
    ("a Parquet file cut short", ["{T}/cut.parquet", "--out={T}/d7"],
     "cut.parquet: not a readable Parquet file"),
    ("a Parquet file with a corrupt page", ["{T}/corrupt.parquet", "--out={T}/d8"],
     "corrupt.parquet: "),
    ("a text file that stops being UTF-8", ["{T}/latin1.txt", "--out={T}/d9"],
     "latin1.txt: not UTF-8 text near byte 20,013"),
    ("a Parquet text that is not UTF-8", ["{T}/latin1.parquet", "--out={T}/d10"],
     "latin1.parquet: row 301 is not UTF-8"),
]


def damage_files(folder: Path) -> None:
    """One damaged file of each kind prepare reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    lines = "".join(json.dumps({"text": d}) + "\n" for d in documents(400, seed=20)).encode()
    gz = gzip.compress(lines)
    (folder / "cut.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    (folder / "corrupt.jsonl.gz").write_bytes(gz[:200] + bytes(200) + gz[400:])
    zst = zstandard.ZstdCompressor().compress(lines)
    (folder / "cut.jsonl.zst").write_bytes(zst[: len(zst) // 2])
    (folder / "corrupt.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64) + zst[68:])
    text = lines.split(b"\n")
    (folder / "cut.jsonl").write_bytes(b"\n".join(text[:29] + [text[29][:20]]))
    (folder / "latin1.jsonl").write_bytes(text[0] + b"\n" + '{"text": "café"}\n'.encode("latin-1"))
    pq.write_table(pa.table({"text": documents(3000, seed=21)}), folder / "good.parquet",
                   compression="snappy")
    raw = (folder / "good.parquet").read_bytes()
    (folder / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    (folder / "corrupt.parquet").write_bytes(raw[:1000] + bytes(2000) + raw[3000:])
    (folder / "good.parquet").unlink()
    (folder / "latin1.txt").write_bytes(b"a line of text\n" * 1334 + "café\n".encode("latin-1"))
    # A string column holding Latin-1 (Arrow checks what it writes; other writers need not).
    texts = [d.encode() for d in documents(400, seed=22)]
    texts[300] = "café".encode("latin-1")
    offsets = np.cumsum([0] + [len(t) for t in texts]).astype(np.int32)
    column = pa.Array.from_buffers(pa.string(), len(texts), [
        None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(texts))])
    pq.write_table(pa.table({"text": column}), folder / "latin1.parquet", row_group_size=256)


def test_bad_inputs_are_one_line_and_write_nothing(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    (tmp_path / "fields.jsonl").write_text(json.dumps({"title": "a", "body": "b"}) + "\n")
    pq.write_table(pa.table({"title": ["a"], "body": ["b"]}), tmp_path / "fields.parquet")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "doc.txt").write_text("a short document\n")
    (tmp_path / "exists").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("not to be deleted")
    damage_files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())

    def run(row):
        args = [a.replace("{T}", str(tmp_path)) for a in row[1]]
        return row, run_cli("-m", "transformer", "prepare", *args, "--noprogress", timeout=60)

    with ThreadPoolExecutor(4) as pool:
        for (what, _, phrase), out in pool.map(run, BAD):
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1, (what, out.stderr)
            assert lines[0].startswith("error:") and phrase in lines[0], (what, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "notes" / "mine.txt").read_text() == "not to be deleted"


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("set")
    inputs = write_inputs(folder / "in", documents(600, seed=8))
    prep.prepare(inputs, folder / "set", val_fraction=0.2)
    return folder / "set"


def test_batches_are_pure_and_rows_split_across_processes(small_set):
    a, b = prepared.PreparedSet(small_set, 16), prepared.PreparedSet(small_set, 16)
    for split in ("train", "val"):
        whole = a.batch(3, split, 7, 8)
        assert all(np.array_equal(whole[k], b.batch(3, split, 7, 8)[k]) for k in whole)
        first, second = a.batch(3, split, 7, 8, rows=[0, 2, 4, 6]), a.batch(3, split, 7, 8,
                                                                              rows=[1, 3, 5, 7])
        for k in whole:  # two processes' rows: disjoint, and together the one-process batch
            np.testing.assert_array_equal(whole[k][0::2], first[k])
            np.testing.assert_array_equal(whole[k][1::2], second[k])
        np.testing.assert_array_equal(whole["inputs"][:, 1:], whole["targets"][:, :-1])
    assert not np.array_equal(a.batch(3, "train", 7, 8)["inputs"], a.batch(4, "train", 7, 8)
                              ["inputs"])


def test_an_epoch_visits_every_window_once_in_an_order_keyed_by_seed_and_epoch(small_set):
    s = prepared.PreparedSet(small_set, 16)
    n = s.windows["train"]
    epoch0 = s.window_numbers(0, "train", np.arange(n))
    epoch1 = s.window_numbers(0, "train", np.arange(n, 2 * n))
    assert sorted(epoch0) == sorted(epoch1) == list(range(n))
    assert not np.array_equal(epoch0, epoch1)
    assert not np.array_equal(epoch0, s.window_numbers(1, "train", np.arange(n)))
    # Windows tile the split's tokens: every token is a target exactly once per epoch.
    T, tokens = 16, np.concatenate(read_split(small_set, "train"))
    B = 4
    targets = np.concatenate([s.batch(0, "train", i, B)["targets"] for i in range(n // B)])
    assert len(targets) == (n // B) * B
    first_tokens = [tokens[w * T:w * T + T + 1] for w in epoch0[: len(targets)]]
    np.testing.assert_array_equal(np.stack(first_tokens)[:, 1:], targets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4097])
def test_permute_is_a_bijection(n):
    y = prepared.permute(np.arange(n), n, (0, 0, 0))
    assert sorted(y.tolist()) == list(range(n))


def test_data_load_takes_the_folders_tokenizer_and_refuses_another(small_set):
    config = config_lib.base_config()
    config.data.corpus = str(small_set)
    config.model.max_seq_len = 16
    tok, source = data.load(config)
    assert tok.kind == "byte" and tok.vocab_size == 257 and tok.eot == 256
    assert data.load(config, tokenizers.from_json(tok.to_json()))[0].vocab_size == 257
    with pytest.raises(CorpusError, match="not the checkpoint's"):
        data.load(config, tokenizers.ByteTokenizer())
    assert 1.0 < data.tokens_per_byte(tok, source) < 1.1  # bytes plus one end token a document
    assert "epochs" in data.describe(config, source)


@pytest.mark.slow  # in process: batches are pure (above), test_training's resume
def test_sigkill_resume_on_a_prepared_set_is_bitwise(small_set, tmp_path):
    from tests import test_resume as r
    extra = ["--config.data.tokenizer=byte"]
    baseline = tmp_path / "baseline"
    out = r.run(r.train_args(small_set, baseline, extra=extra))
    assert out.returncode == 0, out.stderr
    assert "prepared set" in out.stdout and "epochs" in out.stdout
    workdir = tmp_path / "run"
    proc = r.start(r.train_args(small_set, workdir, extra=extra), step_delay=0.03)
    r.wait_for(lambda: r.committed(workdir), proc)
    time.sleep(random.uniform(0.0, 0.2))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    out = r.run(r.train_args(small_set, workdir, extra=extra))
    assert out.returncode == 0 and "resuming from step" in out.stdout, out.stderr
    r.assert_bitwise_equal(workdir, r.final_state(baseline))


@pytest.mark.slow
def test_prepare_peak_memory_does_not_grow_with_the_input(tmp_path):
    def peak_mb(copies: int) -> float:
        path = tmp_path / f"in{copies}.jsonl"
        block = "".join(json.dumps({"text": d}) + "\n" for d in documents(8000, seed=9))
        with open(path, "w") as f:  # ~1.3 MB a copy
            for _ in range(copies):
                f.write(block)
        code = ("import resource, sys; from transformer.data import prepare as p; "
                "p.prepare([sys.argv[1]], sys.argv[2]); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
        out = run_cli("-c", code, path, tmp_path / f"out{copies}", timeout=120, fork=False)
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[-1])

    small, large = peak_mb(6), peak_mb(24)
    print(f"peak RSS: {small:.0f} MB for ~8 MB of input, {large:.0f} MB for ~32 MB")
    assert large < small * 1.2


def test_a_byte_model_of_a_prepared_set_exports_its_end_of_text_token():
    from tokenizers import Tokenizer

    from transformer.hf.export import tokenizer_json
    tok = Tokenizer.from_str(tokenizer_json(tokenizers.ByteTokenizer(eot=True)))
    assert tok.get_vocab_size() == 257 and tok.encode("é<|endoftext|>").ids == [195, 169, 256]


def test_the_default_models_vocabulary_is_refused_for_a_prepared_byte_set_in_one_line(small_set):
    out = run_cli("train.py", "--config=configs/tiny.py", f"--config.data.corpus={small_set}",
                  "--workdir=/nonexistent/never-created", "--config.model.vocab_size=256",
                  timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "257 tokens; set at least that, or 0" in lines[0]


def test_small_shards_hold_the_same_tokens_and_windows_never_span_two(tmp_path):
    inputs = write_inputs(tmp_path / "in", documents(300, seed=10))
    prep.prepare(inputs, tmp_path / "one", val_fraction=0.2)
    manifest = prep.prepare(inputs, tmp_path / "many", val_fraction=0.2, shard_tokens=2000)
    assert len(manifest["splits"]["train"]["shards"]) > 3
    for split in ("train", "val"):
        assert [a.tolist() for a in read_split(tmp_path / "many", split)] == \
            [a.tolist() for a in read_split(tmp_path / "one", split)]
    s, T = prepared.PreparedSet(tmp_path / "many", 16), 16
    shards = [np.fromfile(tmp_path / "many" / x["file"], np.uint16)
              for x in manifest["splits"]["train"]["shards"]]
    windows = [sh[w * T:w * T + T + 1] for sh in shards for w in range((len(sh) - 1) // T)]
    assert s.windows["train"] == len(windows)
    order = s.window_numbers(5, "train", np.arange(8))
    np.testing.assert_array_equal(s.batch(5, "train", 0, 8)["inputs"],
                                  np.stack([windows[w][:-1] for w in order]))


def test_an_error_while_writing_stops_the_reader_at_once(tmp_path, monkeypatch):
    inputs = write_inputs(tmp_path / "in", documents(3000, seed=11))
    monkeypatch.setattr(prep, "BATCH_CHARS", 1000)

    def fail(*_):
        raise OSError("disk full")
    monkeypatch.setattr(prep.SplitWriter, "add", fail)
    reader_done = []
    units = prep.Reader.units

    def counting(self):
        yield from units(self)
        reader_done.append(True)
    monkeypatch.setattr(prep.Reader, "units", counting)
    with pytest.raises(OSError, match="disk full"):
        prep.prepare(inputs, tmp_path / "set")
    assert not reader_done  # it stopped at its next batch, not after reading everything
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("own_end", [None, "</s>"])
def test_a_tokenizer_file_from_disk_is_used_as_it_is_with_its_own_end_token(own_end, tmp_path):
    from tokenizers import Tokenizer
    docs = documents(80, seed=12)
    trained = tokenizers.BPETokenizer.train(iter(docs), 300).hf_tokenizer()
    if own_end:
        trained.add_special_tokens([own_end])
    trained.save(str(tmp_path / "given.json"))
    inputs = write_inputs(tmp_path / "in", docs)
    manifest = prep.prepare(inputs, tmp_path / "set", tokenizer=str(tmp_path / "given.json"),
                            val_fraction=0.2)
    tok = Tokenizer.from_file(str(tmp_path / "set" / "tokenizer.json"))
    eot = manifest["tokenizer"]["eot"]
    assert eot == tok.token_to_id(own_end or tokenizers.EOT)
    train = [d for d in docs if not prep.is_val(d, 0.2)]
    assert [a.tolist() for a in read_split(tmp_path / "set", "train")] == \
        [tok.encode(d).ids + [eot] for d in train]


def test_an_end_token_the_file_does_not_mark_special_is_still_never_parsed(tmp_path):
    """A tokenizer.json whose end token is an added token not marked special: a document
    holding its string stores it as text, with one end token (at its end), in prepare and in
    the set's tokenizer that encodes prompts."""
    from tokenizers import AddedToken
    docs = [d + " <|endoftext|> and on" for d in documents(60, seed=23)]
    trained = tokenizers.BPETokenizer.train(iter(docs), 300).hf_tokenizer()
    trained.add_tokens([AddedToken(tokenizers.EOT, special=False)])
    trained.save(str(tmp_path / "given.json"))
    inputs = write_inputs(tmp_path / "in", docs)
    prep.prepare(inputs, tmp_path / "set", tokenizer=str(tmp_path / "given.json"),
                 val_fraction=0.2)
    tok = prepared.PreparedSet(tmp_path / "set", 8).tokenizer
    assert tok.eot == trained.token_to_id(tokenizers.EOT)
    stored = [a for split in ("train", "val") for a in read_split(tmp_path / "set", split)]
    assert [(a == tok.eot).sum() for a in stored] == [1] * len(docs)
    assert all(a[-1] == tok.eot for a in stored)
    assert sorted(tok.decode(a[:-1]) for a in stored) == sorted(docs)
    assert tok.eot not in tok.encode("a <|endoftext|> b")


def test_a_tokenizer_files_saved_truncation_and_padding_are_not_applied(tmp_path):
    """A tokenizer.json saved with truncation and padding on (max_length 64, padded to 128:
    as many a file from a model's repository has) stores every document whole, as its full
    encoding and its end token, and the set's tokenizer encodes a prompt whole."""
    docs = ["".join(documents(40, seed=30 + i)) for i in range(40)]
    trained = tokenizers.BPETokenizer.train(iter(docs), 300).hf_tokenizer()
    whole = [e.ids for e in trained.encode_batch(docs, add_special_tokens=False)]
    assert min(map(len, whole)) > 128
    trained.add_special_tokens(["<pad>"])
    trained.enable_truncation(max_length=64)
    trained.enable_padding(pad_id=trained.token_to_id("<pad>"), pad_token="<pad>", length=128)
    trained.save(str(tmp_path / "given.json"))
    (tmp_path / "in").mkdir()
    for k, d in enumerate(docs):
        (tmp_path / "in" / f"{k:03d}.txt").write_text(d)
    manifest = prep.prepare([tmp_path / "in"], tmp_path / "set", val_fraction=0.2,
                            tokenizer=str(tmp_path / "given.json"))
    eot = manifest["tokenizer"]["eot"]
    stored = [a.tolist() for split in ("train", "val") for a in read_split(tmp_path / "set", split)]
    assert sorted(stored) == sorted(ids + [eot] for ids in whole)
    assert prepared.PreparedSet(tmp_path / "set", 8).tokenizer.encode(docs[0]) == whole[0]


def _gapped_tokenizer(path: Path, merged_id: int, end: bool) -> None:
    """A byte-level tokenizer.json whose one merge ("ab") has the id `merged_id`, past its
    count of tokens (its ids have gaps), with its own end token after it or none."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {c: b for b, c in tokenizers._bytes_to_unicode().items()}
    vocab["ab"] = merged_id
    if end:
        vocab[tokenizers.EOT] = merged_id + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if end:
        tok.add_special_tokens([tokenizers.EOT])
    tok.save(str(path))


def test_a_tokenizer_file_whose_ids_have_gaps_keeps_every_id(tmp_path):
    """The vocabulary is one past the largest id, not the count of tokens: an id past the
    count (70,000 in a file of 258 tokens) is stored as itself (uint32), every id is below the
    vocabulary a model is built with; an end token the library would number onto another
    token's id is refused in one line, with no folder."""
    docs = [f"ab cab {i} dab\n" * 5 for i in range(40)]
    (tmp_path / "in").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "in" / f"{i}.txt").write_text(d)
    _gapped_tokenizer(tmp_path / "gaps.json", 70_000, end=True)
    manifest = prep.prepare([tmp_path / "in"], tmp_path / "set", val_fraction=0.3,
                            tokenizer=str(tmp_path / "gaps.json"))
    stored = [a for split in ("train", "val") for a in read_split(tmp_path / "set", split)]
    tok = prepared.PreparedSet(tmp_path / "set", 8).tokenizer
    assert 70_000 in tok.encode(docs[0])
    assert sorted(a.tolist() for a in stored) == sorted(tok.encode(d) + [tok.eot] for d in docs)
    assert max(int(a.max()) for a in stored) < manifest["tokenizer"]["vocab_size"] == \
        tok.vocab_size
    _gapped_tokenizer(tmp_path / "collide.json", 257, end=False)  # 256 free: the added id
    with pytest.raises(CorpusError, match="already the id of another token"):
        prep.prepare([tmp_path / "in"], tmp_path / "set2", tokenizer=str(tmp_path /
                                                                          "collide.json"))
    assert not (tmp_path / "set2").exists()


def test_a_piece_ends_at_the_last_line_boundary_of_its_second_half():
    """The cut (found with rfind) is the regex definition: the last position in
    [start + target/2, start + target) just after a newline between two non-space characters
    (Unicode spaces included), else the first such position after, else none (never a cut
    that is not a boundary)."""
    import random
    import re

    from transformer.data.sources import _cut
    boundary = re.compile(r"(?<=\S\n)(?=\S)")
    rng = random.Random(1)
    atoms = ["a", "é", "\n", " \n", "\n ", "\u3000\n", "x\ny", "\r\n", "\t", "\n\n", "q" * 40]
    for _ in range(400):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 200)))
        start, target = rng.randint(0, len(text)), rng.randint(2, 120)
        inside = [m.start() for m in boundary.finditer(text, start + target // 2, start + target)]
        after = boundary.search(text, start + target)
        want = inside[-1] if inside else after.start() if after else None
        assert _cut(text, target, start) == want, (text, start, target)


def _authors_tokenizer(kind: str, docs: list[str], path: Path) -> tuple[str, str]:
    """A tokenizer.json as its authors ship one (built here: nothing is downloaded), with a
    post-processor that puts a BOS before every text: "bytelevel" as Llama 3 (byte-level BPE),
    "metaspace" as Llama 2 / Mistral (a Metaspace pre-tokenizer: "▁" before the first word).
    Returns its (BOS, EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    if kind == "bytelevel":
        bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        bos, eos, alphabet = "<s>", "</s>", []
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=400, special_tokens=[bos, eos], initial_alphabet=alphabet,
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(path))
    return bos, eos


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_a_tokenizer_file_is_applied_as_its_authors_apply_it(kind, tmp_path):
    """Its post-processor's BOS is not put into the data, and a text file is cut into pieces
    only where that keeps the ids: every document's stored ids are its whole encoding (as text,
    no special tokens added) and its end token, a multi-piece file's too."""
    from tokenizers import Tokenizer

    from transformer.data.sources import PIECE_CHARS
    docs = documents(60, seed=15)
    big = "".join(documents(500, seed=16))
    assert len(big) > 4 * PIECE_CHARS
    bos, eos = _authors_tokenizer(kind, docs + [big], tmp_path / "tokenizer.json")
    (tmp_path / "small.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "big.txt").write_text(big)
    out = tmp_path / "set"
    manifest = prep.prepare([tmp_path / "small.jsonl", tmp_path / "big.txt"], out,
                            tokenizer=str(tmp_path / "tokenizer.json"), val_fraction=0.2)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eot = manifest["tokenizer"]["eot"]
    assert eot == tok.token_to_id(eos)
    for split in ("train", "val"):
        expected = [tok.encode(d, add_special_tokens=False).ids + [eot] for d in docs + [big]
                    if prep.is_val(d, 0.2) == (split == "val")]
        got = [a.tolist() for a in read_split(out, split)]
        assert got == expected, split
        assert tok.token_to_id(bos) not in np.concatenate(read_split(out, split))
    assert manifest["text_in_pieces"] == (kind == "bytelevel")  # Metaspace: files read whole


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_the_tails_cut_cuts_the_documents_ids_not_its_text(kind, tmp_path):
    """A corpus of one document holds out its tail: the two splits' ids, one after the other,
    are the document's whole encoding and its end token. Cutting the text instead encoded the
    held-out part alone, and a Metaspace tokenizer then put a "▁" word start before its first
    word, which the whole document has only after a space."""
    from tokenizers import Tokenizer
    text = "\n".join(documents(80, seed=18))  # lines starting mid-document: no "▁" there
    _, eos = _authors_tokenizer(kind, [text], tmp_path / "tokenizer.json")
    (tmp_path / "one.txt").write_text(text)
    out = tmp_path / "set"
    manifest = prep.prepare([tmp_path / "one.txt"], out, val_fraction=0.1,
                            tokenizer=str(tmp_path / "tokenizer.json"))
    assert manifest["split"]["rule"] == "tail"
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    train, val = (np.concatenate(read_split(out, s)).tolist() for s in ("train", "val"))
    assert train and len(val) > 1 and len(val) < len(train)
    assert train + val == tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id(eos)]


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_a_literal_end_of_text_in_a_document_is_text_in_prepare_and_at_sample_time(kind,
                                                                                 tmp_path):
    """The end token is placed, never parsed: a document holding the string "<|endoftext|>"
    is stored as the folder's tokenizer (what a checkpoint saves, what sample.py and the server
    encode prompts with) encodes that text, and holds one end token, at its end."""
    docs = [d + (" <|endoftext|> and on" if i % 3 == 0 else "")
            for i, d in enumerate(documents(60, seed=17))]
    out = tmp_path / "set"
    prep.prepare(write_inputs(tmp_path / "in", docs), out, tokenizer=kind, vocab_size=300,
                 val_fraction=0.2)
    tok = prepared.PreparedSet(out, 8).tokenizer
    saved = tokenizers.from_json(tok.to_json())
    for split in ("train", "val"):
        mine = [d for d in docs if prep.is_val(d, 0.2) == (split == "val")]
        stored = read_split(out, split)
        assert [a.tolist() for a in stored] == [list(tok.encode(d)) + [tok.eot] for d in mine]
        assert [list(saved.encode(d)) for d in mine] == [a.tolist()[:-1] for a in stored]
        assert [(a == tok.eot).sum() for a in stored] == [1] * len(mine)
        assert [tok.decode(a[:-1]) for a in stored] == mine
    assert tok.eot not in tok.encode("a <|endoftext|> b")


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_a_record_whose_text_is_not_unicode_is_skipped_and_counted(kind, tmp_path):
    """JSON allows an unpaired surrogate ("\\ud800"), which no UTF-8 text holds: such a
    record is left out and counted as a bad record, like one whose text is not a string; every
    stored byte sequence is UTF-8, and a surrogate pair (an emoji) is ordinary text."""
    docs = documents(60, seed=18)
    docs[5] += " \U0001F600 paired"
    lines = [json.dumps({"text": d}) for d in docs]
    lines[7] = json.dumps({"text": docs[7] + " \ud800 unpaired"})
    lines[9] = '{"text": "lone low \\uDC00 half"}'
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "set"
    manifest = prep.prepare([tmp_path / "a.jsonl"], out, tokenizer=kind, vocab_size=300,
                            val_fraction=0.2)
    assert manifest["skipped"] == {"bad_records": 2}
    kept = [d for i, d in enumerate(docs) if i not in (7, 9)]
    tok = prepared.PreparedSet(out, 8).tokenizer
    stored = [a for split in ("train", "val") for a in read_split(out, split)]
    assert sorted(a.tolist() for a in stored) == sorted(list(tok.encode(d)) + [tok.eot]
                                                        for d in kept)
    if kind == "byte":
        for a in stored:
            bytes(a[:-1].astype(np.uint8)).decode("utf-8")  # strict: raises on a surrogate


def test_the_first_jsonl_record_decides_the_text_field_by_its_keys_not_its_value(tmp_path):
    """A first record that has the field with a null text is a bad record (the rest are
    prepared), not a wrong --text_field; and the first record is the first non-blank line, so a
    wrong field after a blank first line is still named with the fields there are."""
    docs = documents(60, seed=19)
    (tmp_path / "null.jsonl").write_text("".join(json.dumps({"id": 0, "text": d}) + "\n"
                                                 for d in [None] + docs))
    manifest = prep.prepare([tmp_path / "null.jsonl"], tmp_path / "set", val_fraction=0.2)
    assert manifest["skipped"] == {"bad_records": 1}
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] \
        == len(docs)
    (tmp_path / "blank.jsonl").write_text("\n" + "".join(json.dumps({"body": d}) + "\n"
                                                         for d in docs))
    with pytest.raises(CorpusError, match=r"blank.jsonl: line 2 has no 'text' field \(it has: "
                                          r"body\); pass --text_field=NAME"):
        prep.prepare([tmp_path / "blank.jsonl"], tmp_path / "set2")
    assert not (tmp_path / "set2").exists()


def test_a_prepared_folder_is_on_disk_before_it_has_its_name(tmp_path, monkeypatch):
    """Power loss, not only SIGKILL: every file of the folder and the folder itself are fsynced
    before the rename that names it, and the parent folder after it (else the name can reach
    the disk before the data it names)."""
    import os
    events, fsync, rename = [], os.fsync, os.rename

    def recording_fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    def recording_rename(a, b):
        events.append(("rename", os.path.realpath(a), os.path.realpath(b)))
        rename(a, b)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    out = tmp_path / "set"
    prep.prepare(write_inputs(tmp_path / "in", documents(100, seed=22)), out, val_fraction=0.2)
    [(at, tmp)] = [(i, e[1]) for i, e in enumerate(events) if e[0] == "rename"]
    before = {e[1] for e in events[:at] if e[0] == "fsync"}
    assert {os.path.join(tmp, p.name) for p in out.iterdir()} | {tmp} <= before
    assert os.path.realpath(tmp_path) in {e[1] for e in events[at:] if e[0] == "fsync"}

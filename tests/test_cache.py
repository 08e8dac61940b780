"""One loader: a corpus named directly is prepared once into the cache (content-keyed) and read
as any prepared folder is; the folder it makes is the one `prepare` makes of the same text."""

import math
import os
import platform

import numpy as np
import pytest
from conftest import ROOT
from test_prepare import documents, read_split

from transformer import data
from transformer.config import base_config
from transformer.data import cache, prepare, prepared, tokenizers


def config_for(corpus, tokenizer="byte", max_bytes=4_000_000, seq_len=16):
    c = base_config()
    c.model.max_seq_len = seq_len
    c.data.update(corpus=str(corpus), tokenizer=tokenizer, max_bytes=max_bytes,
                  bpe_vocab_size=300)
    return c


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own (the session's is shared by every test)."""
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def folder_of(source):
    return source.folder


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_a_folder_named_directly_is_what_prepare_makes_of_it(kind, tmp_path, own_cache):
    """Same split, same tokenizer, same shards, token for token: there is one path."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(documents(80, seed=3)):
        (docs / f"{i:03d}.txt").write_text(text)
    tok, source = data.load(config_for(docs, kind))
    made = prepare.prepare([docs], tmp_path / "set", tokenizer=kind, vocab_size=300)
    assert tokenizers.fingerprint(tok) == made["tokenizer"]["sha256"]
    assert source.folder.parent == own_cache / "prepared"
    for split in ("train", "val"):
        assert [a.tolist() for a in read_split(source.folder, split)] == \
            [b.tolist() for b in read_split(tmp_path / "set", split)]
    assert tok.eot == tok.vocab_size - 1
    assert source.tokens_per_byte() == pytest.approx(
        made["splits"]["val"]["tokens"] / made["splits"]["val"]["bytes"])


def test_the_cache_is_keyed_by_content_and_prepared_once(tmp_path, own_cache, monkeypatch):
    corpus = tmp_path / "text.txt"
    original = "".join(documents(40, seed=4))
    corpus.write_text(original)
    _, first = data.load(config_for(corpus))
    assert first.prepared_in is not None and "prepared just now" in first.describe(
        config_for(corpus))
    writes = []
    monkeypatch.setattr(prepare, "write", lambda *a, **k: writes.append(a))
    _, again = data.load(config_for(corpus))
    assert again.prepared_in is None and again.folder == first.folder and writes == []
    assert "prepared by an earlier run" in again.describe(config_for(corpus))
    monkeypatch.undo()
    monkeypatch.setenv("TRANSFORMER_CACHE", str(own_cache))
    # Another max_bytes, other content, another tokenizer: each its own folder.
    folders = {first.folder}
    folders.add(data.load(config_for(corpus, max_bytes=3000))[1].folder)
    folders.add(data.load(config_for(corpus, tokenizer="char"))[1].folder)
    corpus.write_text(original.replace("the", "a", 1))  # one word changed
    folders.add(data.load(config_for(corpus))[1].folder)
    assert len(folders) == 4
    # Clearing the cache is safe: the next start prepares it again, the same tokens.
    tokens = read_split(first.folder, "train")
    for folder in (own_cache / "prepared").iterdir():
        if folder.is_dir():
            import shutil
            shutil.rmtree(folder)
    corpus.write_text(original)
    _, rebuilt = data.load(config_for(corpus))
    assert rebuilt.folder == first.folder and rebuilt.prepared_in is not None
    assert [a.tolist() for a in read_split(rebuilt.folder, "train")] == [a.tolist() for a in tokens]


def test_a_corpus_too_small_to_split_by_document_holds_out_its_tail(tmp_path, own_cache):
    """One file is one document: its last val_fraction of bytes, from the first line boundary
    there, is held out, and the data line says so."""
    text = "".join(documents(30, seed=5))
    (tmp_path / "small.txt").write_text(text)
    config = config_for(tmp_path / "small.txt", max_bytes=10**6)
    tok, source = data.load(config)
    need = math.ceil(0.05 * len(text.encode()))
    [train] = [tok.decode(a) for a in read_split(source.folder, "train")]
    [val] = [tok.decode(a) for a in read_split(source.folder, "val")]
    assert train + val == text and 0 < len(val.encode()) <= need
    assert len(val.encode()) == need or train.endswith("\n")
    assert "val: the last 5.0% of the text (too few documents" in source.describe(config)


@pytest.mark.parametrize("past", [0, 1, 2, 3])
def test_max_bytes_at_a_piece_boundary_keeps_every_byte_read_and_ends_the_document(
        past, tmp_path, own_cache):
    """A budget that ends with a piece of a file (past=0), or leaves less than the next
    piece's first character (a 3-byte one: past=1, 2), still ends the document there: every
    byte read is stored, and each document holds one end token."""
    from transformer.data import sources
    lines = [f"中{i} " + " ".join(documents(1, seed=i)[0].split()) + "\n" for i in range(3000)]
    (tmp_path / "a.txt").write_text("".join(lines))
    (tmp_path / "b.txt").write_text("".join(lines[:50]))
    pieces = [t for t, _ in sources.Reader([tmp_path / "a.txt"]).units()]
    assert len(pieces) > 3 and pieces[2].startswith("中")
    budget = len("".join(pieces[:2]).encode()) + past
    tok, source = data.load(config_for(tmp_path, max_bytes=budget))
    splits = source.manifest["splits"]
    assert source.read.bytes == budget - (past in (1, 2)) * past
    assert splits["train"]["bytes"] + splits["val"]["bytes"] == source.read.bytes
    stored = [a for split in ("train", "val") for a in read_split(source.folder, split)]
    assert sum(int((a == tok.eot).sum()) for a in stored) == 1
    assert splits["train"]["documents"] + splits["val"]["documents"] == 1


def test_records_without_a_text_are_reported_as_records_not_files(tmp_path, own_cache):
    """Named directly, a JSON Lines file's records without a text are counted as what they
    are, in the run's data line and the manifest (as prepare counts them), and a binary file
    as a file."""
    import json
    docs = documents(60, seed=26)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(
        json.dumps({"text": None if i % 20 == 1 else d}) + "\n" for i, d in enumerate(docs)))
    (tmp_path / "in" / "b.bin").write_bytes(bytes(range(256)))
    config = config_for(tmp_path / "in", seq_len=4)
    _, source = data.load(config)
    line = data.describe(config, source)
    assert "1 binary or unreadable files skipped" in line
    assert "3 records without a text left out" in line
    assert source.manifest["skipped"] == {"skipped_files": 1, "bad_records": 3} == \
        prepare.prepare([tmp_path / "in"], tmp_path / "set")["skipped"]


def test_a_set_prepared_by_another_version_is_not_reused(tmp_path, own_cache, monkeypatch):
    """The cache's key carries its format: a folder made by the code before one end token a
    document and the split by document (format 1) is never what a run of this code reads."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(documents(60, seed=11)))
    monkeypatch.setattr(cache, "FORMAT", 1)
    old = data.load(config_for(corpus))[1].folder
    monkeypatch.undo()
    monkeypatch.setenv("TRANSFORMER_CACHE", str(own_cache))
    _, source = data.load(config_for(corpus))
    assert source.folder != old and source.prepared_in is not None
    assert source.manifest["split"]["rule"] in ("documents", "tail")


def test_a_resumed_runs_own_tokenizer_reads_the_text_with_its_own_ids(tmp_path, own_cache):
    """A checkpoint from before end-of-text tokens (byte, vocabulary 256): the set is prepared
    with that tokenizer, no end tokens, ids below 256."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(documents(40, seed=6)))
    old = tokenizers.ByteTokenizer()
    tok, source = data.load(config_for(corpus), tokenizer=old)
    assert tok.vocab_size == 256 and tok.eot is None
    assert max(int(a.max()) for a in read_split(source.folder, "train")) < 256
    assert source.folder != data.load(config_for(corpus))[1].folder


def test_an_unwritable_cache_is_one_line_naming_the_variable(tmp_path):
    (tmp_path / "text.txt").write_text("".join(documents(40, seed=7)))
    (tmp_path / "ro").write_text("a file, so nothing can be made under it")
    from conftest import fork_run
    out = fork_run("train.py", "--config=configs/tiny.py",
                   f"--config.data.corpus={tmp_path / 'text.txt'}", f"--workdir={tmp_path / 'run'}",
                   cwd=ROOT, timeout=120,
                   env={**os.environ, "TRANSFORMER_CACHE": str(tmp_path / "ro" / "cache")})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error:") and "TRANSFORMER_CACHE" in lines[0]


def test_processes_preparing_one_set_at_once_all_read_the_same_complete_folder(tmp_path):
    """Four processes start on a corpus nobody has prepared: one prepares, the others wait
    for it (a lock per folder); every one reads the same folder, and nothing is left over."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(documents(400, seed=8)))
    script = ("import sys; from transformer import data; from test_cache import config_for; "
              "tok, s = data.load(config_for(sys.argv[1], 'bpe')); "
              "print(s.folder, s.prepared_in is not None)")
    env = {**os.environ, "TRANSFORMER_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    from conftest import fork_popen
    procs = [fork_popen(["-c", script, corpus], cwd=ROOT, env=env) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    folders = {out.split()[0] for out, _ in outs}
    assert len(folders) == 1
    assert sum(out.split()[1] == "True" for out, _ in outs) == 1  # prepared once
    assert sorted(p.name for p in (tmp_path / "cache" / "prepared").iterdir()) == \
        [os.path.basename(folders.pop())]
    assert prepared.is_prepared(tmp_path / "cache" / "prepared" / os.listdir(
        tmp_path / "cache" / "prepared")[0])


def test_the_summary_and_a_batch_of_the_quick_start_corpus(own_cache):
    """stdlib read through the cache: the run's data line says what was read and where it is."""
    c = config_for("stdlib", max_bytes=200_000, seq_len=32)
    tok, source = data.load(c)
    line = data.describe(c, source)
    assert line.startswith(f"Python {platform.python_version()} standard library sources "
                           "(0.20 MB of text from")
    assert "prepared just now" in line and str(own_cache / "prepared") in line
    assert "; val: the last 5.0% of the text (too few documents" in line  # 13 files, none held
    assert tok.vocab_size == 257
    batch = source.batch(0, "train", 0, 4)
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_the_cache_command_lists_the_sets_and_clear_deletes_them(tmp_path, own_cache):
    from conftest import run_cli
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(documents(40, seed=9)))
    _, source = data.load(config_for(corpus))
    leftover = own_cache / "prepared" / ".text.txt-byte-x.partial-999999999-abc"  # a dead pid
    leftover.mkdir()
    env = {"TRANSFORMER_CACHE": str(own_cache)}
    listed = run_cli("-m", "transformer", "cache", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"data cache: {own_cache / 'prepared'} (2 prepared sets" in listed.stdout
    assert source.folder.name in listed.stdout and "byte vocabulary 257" in listed.stdout
    assert "incomplete" in listed.stdout
    cleared = run_cli("-m", "transformer", "cache", "--clear", env=env, timeout=60)
    assert cleared.returncode == 0 and "deleted 2 prepared sets" in cleared.stdout
    assert list((own_cache / "prepared").iterdir()) == []
    _, again = data.load(config_for(corpus))  # what a later run does: prepared again
    assert again.folder == source.folder and again.prepared_in is not None


@pytest.mark.parametrize("change", ["edit", "append"])
def test_text_that_changes_while_it_is_prepared_leaves_no_folder(change, tmp_path, own_cache,
                                                                monkeypatch):
    """The fingerprint pass reads one text, the prepare another (a file edited or grown in
    between): refused in one line, and no folder claims a key its tokens do not match."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(documents(40, seed=10)))
    units, passes = cache.TextCorpus.units, []

    def changing(self):
        passes.append(1)
        for i, (text, ends) in enumerate(units(self)):
            yield (text.replace("e", "E") if change == "edit" and len(passes) > 1 and i == 0
                   else text), ends
        if change == "append" and len(passes) > 1:
            yield "one more document", True

    monkeypatch.setattr(cache.TextCorpus, "units", changing)
    with pytest.raises(data.CorpusError, match="changed while it was read"):
        data.load(config_for(corpus))
    assert [p for p in (own_cache / "prepared").iterdir() if not p.name.startswith(".")] == []

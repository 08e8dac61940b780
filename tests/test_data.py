"""Tokenizers round-trip any text; batches are pure functions of (seed, split, index)."""

import numpy as np
import pytest

from transformer import data
from transformer.config import base_config
from transformer.data import batches, cache, corpus, tokenizers

TEXT = "def f(x):\n    return x * 2  # 猫喜欢鱼 ✓\n"


def test_byte_tokenizer_round_trips_any_text():
    tok = tokenizers.ByteTokenizer()
    ids = tok.encode(TEXT)
    assert max(ids) < 256 and len(ids) == len(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.encode_array(TEXT).tolist() == ids


def test_char_tokenizer_round_trips_and_names_unknown_characters():
    tok = tokenizers.CharTokenizer.from_text(TEXT)
    assert tok.vocab_size == len(set(TEXT))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    with pytest.raises(tokenizers.TokenizerError, match="'Z'"):
        tok.encode("Zebra")
    again = tokenizers.from_json(tok.to_json())
    assert again.encode(TEXT) == tok.encode(TEXT)


def read(corpus_name, max_bytes):
    """The text a run reads of a corpus named directly, and what it says about it."""
    text = cache.TextCorpus(corpus_name, max_bytes)
    return "".join(t for t, _ in text.units()), text.read


def test_stdlib_corpus_is_real_python_in_a_fixed_order():
    a, _ = read("stdlib", 200_000)
    assert a == read("stdlib", 200_000)[0]
    assert 190_000 <= len(a.encode("utf-8")) <= 200_000
    assert "def " in a and "import " in a


def test_stdlib_files_come_in_the_sorted_order_of_their_relative_paths(tmp_path):
    """The lazy walk yields what listing everything and sorting the paths as strings would:
    on a planted tree whose names sort differently as folders and as strings ("a.py" <
    "a/z.py" < "a_b.py" < "ab/"), and on this Python's own library."""
    import sysconfig
    from pathlib import Path

    def reference(root):
        found = [p for p in root.rglob("*.py")
                 if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)]
        return sorted(found, key=lambda p: p.relative_to(root).as_posix())

    for name in ["a.py", "a/z.py", "a/b/c.py", "a_b.py", "ab/x.py", "a-b/y.py", "B.py",
                 "site-packages/pkg.py", "d/dist-packages/pkg.py", "d/e.txt", "d/f.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    planted = list(corpus._sorted_py_files(tmp_path))
    assert planted == reference(tmp_path) and len(planted) == 8
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert list(corpus.stdlib_files()) == reference(stdlib)


def test_corpus_from_a_folder_skips_binary_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02")
    (tmp_path / "c.txt").write_text("world")
    assert read(str(tmp_path), 1000)[0] == "hello world"


@pytest.mark.parametrize("setup,match", [
    (lambda p: None, "no such file"),
    (lambda p: p.write_text(""), "is empty"),
    (lambda p: p.write_bytes(b"\x00\xff\xfe" * 10), "no UTF-8 text"),
])
def test_bad_corpora_are_refused(tmp_path, setup, match):
    path = tmp_path / "corpus.txt"
    setup(path)
    with pytest.raises(data.CorpusError, match=match):
        read(str(path), 1000)


def test_max_bytes_never_splits_a_character(tmp_path):
    (tmp_path / "zh.txt").write_text("猫喜欢鱼" * 10)
    assert read(str(tmp_path / "zh.txt"), 10)[0] == "猫喜欢"  # 3 whole characters in 10 bytes


def test_copy_task_repeats_its_first_half_and_counts_only_the_copy():
    task = batches.CopyTask(vocab_size=16, seq_len=32)
    b = task.batch(0, "train", 0, 3)
    n = 17
    seq = np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
    np.testing.assert_array_equal(seq[:, n:], seq[:, : 33 - n])
    assert np.all(b["weights"][:, : n - 1] == 0) and np.all(b["weights"][:, n - 1:] == 1)


def test_load_builds_the_configured_tokenizer(tmp_path):
    (tmp_path / "t.txt").write_text("abcabcabc" * 200)
    c = base_config()
    c.model.max_seq_len = 16
    c.data.update(corpus=str(tmp_path / "t.txt"), tokenizer="char")
    tok, source = data.load(c)
    assert tok.vocab_size == 4 and tok.eot == 3  # a, b, c and the end of text
    assert source.batch(0, "train", 0, 2)["inputs"].max() < 4


def test_reading_a_folder_says_how_much_text_came_from_how_many_files(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 1000)
    (tmp_path / "b.bin").write_bytes(bytes(range(256)))
    (tmp_path / "c.txt").write_text("c" * 1000)
    (tmp_path / "d.txt").write_text("d" * 1000)
    (tmp_path / "e.txt").write_text("e" * 1000)
    text, r = read(str(tmp_path), max_bytes=1500)
    assert text == "a" * 1000 + "c" * 500
    assert (r.bytes, r.files, r.skipped, r.unused, r.full) == (1500, 2, 1, 2, True)
    line = corpus.describe(str(tmp_path), r)
    assert "1.5 KB of text from 2 files" in line and "data.max_bytes=1,500 reached" in line
    assert "2 more files unused" in line and "1 binary or unreadable files skipped" in line
    whole = read(str(tmp_path / "a.txt"), max_bytes=10_000)[1]
    assert (whole.files, whole.full, whole.skipped) == (1, False, 0)
    assert "reached" not in whole.describe()


def test_a_corpus_named_directly_reads_only_max_bytes_of_a_large_file(tmp_path, monkeypatch):
    """Not the whole file: what is read stays near max_bytes (plus one read-ahead of ~1 MB)
    however large the file."""
    import builtins

    from transformer.data import sources
    big = tmp_path / "big.txt"
    big.write_text("abcdefghij\n" * 2_000_000)  # 22 MB
    got = []

    class Counted:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            got.append(len(data))
            return data

        def tell(self):
            return self.f.tell()

    monkeypatch.setattr(sources, "open", lambda *a: Counted(builtins.open(*a)), raising=False)
    assert read(str(big), 100)[0] == ("abcdefghij\n" * 10)[:100]
    assert 0 < sum(got) <= 2_000_000, sum(got)

"""The BPE tokenizer: learned on the corpus, lossless, and saved with the run."""

import pytest

from tests.conftest import train_quietly
from transformer import checkpoint
from transformer import config as config_lib
from transformer.config import ConfigError
from transformer.data import tokenizers

TEXT = "def add(a, b):\n    return a + b\n\n" * 200 + "class Point:\n    x = 1\n" * 100


def test_bpe_learns_merges_and_round_trips():
    tok = tokenizers.build("bpe", TEXT, 300)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode(TEXT[:200])
    assert len(ids) < len(TEXT[:200].encode()) / 2  # merges compress this repetitive text
    for text in (TEXT[:500], "naïve 世界 ☃ unseen\tcharacters\n"):  # any text: byte fallback
        assert tok.decode(tok.encode(text)) == text
    assert list(tok.encode_array(TEXT)) == tok.encode(TEXT)


def test_bpe_json_round_trip_and_bad_json():
    tok = tokenizers.build("bpe", TEXT, 300)
    again = tokenizers.from_json(tok.to_json())
    assert again.kind == "bpe" and again.vocab_size == tok.vocab_size
    assert again.encode(TEXT[:300]) == tok.encode(TEXT[:300])
    with pytest.raises(tokenizers.TokenizerError):
        tokenizers.from_json({"kind": "bpe", "tokenizer": "{not json"})


def test_bpe_vocab_size_is_validated():
    c = config_lib.base_config()
    c.data.tokenizer, c.data.bpe_vocab_size = "bpe", 100
    with pytest.raises(ConfigError, match="data.bpe_vocab_size"):
        config_lib.validate(c)


def test_a_bpe_run_saves_its_tokenizer_in_the_checkpoint(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 3)
    c = config_lib.base_config()
    c.model.update(vocab_size=0, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32)
    c.data.update(corpus=str(corpus), tokenizer="bpe", bpe_vocab_size=300)
    c.train.update(steps=2, batch_size=2, log_every=1, eval_every=2, eval_batches=1,
                   ckpt_every=2, warmup_steps=0)
    c.sample.max_new_tokens = 8
    _, the_run = train_quietly(c, tmp_path / "run")
    tok = the_run.tokenizer
    meta = checkpoint.Checkpoints(tmp_path / "run", read_only=True).read_meta()
    assert meta["config"]["model"]["vocab_size"] == tok.vocab_size  # taken from the tokenizer
    assert c.model.vocab_size == 0  # in the saved run's config, not the caller's
    saved = tokenizers.from_json(meta["tokenizer"])
    assert saved.kind == "bpe" and saved.encode(TEXT[:100]) == tok.encode(TEXT[:100])


def test_bpe_is_learned_from_the_training_text_only(tmp_path):
    """The held-out documents (those whose hash falls below val_fraction) hold a word the
    training documents never use. Learned on the whole text (the old way) BPE merged it into
    tokens, which flatters validation bits per byte; learned on the training text it has none."""
    from test_prepare import read_split

    from transformer import data
    from transformer.data.prepare import is_val
    docs = tmp_path / "docs"
    docs.mkdir()
    held, trained, k = 0, 0, 0
    while held < 3 or trained < 60:
        k += 1
        word = "zqxjv " * 300 + str(k)
        cat = "the cat sat on a mat " * 100 + str(k)
        if held < 3 and is_val(word, 0.05):
            (docs / f"w{k}.txt").write_text(word)
            held += 1
        if trained < 60 and not is_val(cat, 0.05):
            (docs / f"c{k}.txt").write_text(cat)
            trained += 1
    config = config_lib.base_config()
    config.model.update(max_seq_len=16, vocab_size=0)
    config.data.update(corpus=str(docs), tokenizer="bpe", bpe_vocab_size=300, val_fraction=0.05)
    tokenizer, source = data.load(config_lib.validate(config))
    pieces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    assert not [p for p in pieces if "zq" in p or "xj" in p], "merges learned on held-out text"
    assert any("cat" in p for p in pieces)  # it did learn the training text's merges
    val_text = "".join(tokenizer.decode(d) for d in read_split(source.folder, "val"))
    assert "zqxjv" in val_text and "cat" not in val_text  # the held-out documents are those
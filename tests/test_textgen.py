"""Streamed text equals the whole text, and never shows half a character."""

import random

from transformer.data import tokenizers
from transformer.generate.text import REPLACEMENT, TextStream, encode_prompt


def _stream(tokenizer, ids):
    stream, pieces = TextStream(tokenizer), []
    for i in ids:
        pieces.append(stream.push(i))
    pieces.append(stream.finish())
    return pieces


def test_byte_stream_holds_back_unfinished_characters():
    tok = tokenizers.ByteTokenizer()
    text = "naïve 中文 ok 😀!"
    pieces = _stream(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)
    assert "中" in pieces and "😀" in pieces  # shown whole, the moment its last byte came


def test_streams_equal_the_whole_decode_even_for_broken_bytes():
    tok, rng = tokenizers.ByteTokenizer(), random.Random(0)
    for _ in range(200):
        ids = [rng.choice([0x41, 0x20, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xAF])
               for _ in range(rng.randint(1, 30))]
        assert "".join(_stream(tok, ids)) == tok.decode(ids)


def test_bpe_and_char_streams_equal_the_whole_decode():
    corpus = "def f(x):\n    return x * 2  # 中文注释\n" * 30
    bpe = tokenizers.BPETokenizer.train(corpus, 300)
    ids = bpe.encode("def g(y): return y  # 中文")
    pieces = _stream(bpe, ids)
    assert "".join(pieces) == bpe.decode(ids) and not any(REPLACEMENT in p for p in pieces)
    char = tokenizers.CharTokenizer.from_text(corpus)
    ids = char.encode("def 中文")
    assert _stream(char, ids)[:-1] == list("def 中文")


def test_a_prompt_longer_than_the_context_is_cut_with_one_note():
    notes = []
    ids = encode_prompt(tokenizers.ByteTokenizer(), "abcdefghij", 4, log=notes.append)
    assert ids == list(b"ghij") and len(notes) == 1 and "last 4 tokens" in notes[0]
    assert encode_prompt(tokenizers.ByteTokenizer(), "abc", 4, log=notes.append) == list(b"abc")
    assert len(notes) == 1

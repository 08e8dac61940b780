"""Text ↔ token ids. A tokenizer is saved with every checkpoint as a small JSON dict.

- `ByteTokenizer`: the UTF-8 bytes of the text, vocabulary 256. Needs no training and encodes
  any text (Chinese takes 3 bytes a character). The default.
- `CharTokenizer`: one id per distinct character of the training corpus (sorted), the classic
  char-level setup; text with a character it never saw is refused with the character named.
- `BPETokenizer`: byte-level BPE (GPT-2's scheme) learned on the training text with the
  `tokenizers` library, `data.bpe_vocab_size` tokens. Encodes any text (unseen characters fall
  back to their bytes); the learned merges travel with the checkpoint inside its JSON.
"""

from __future__ import annotations

import re

import numpy as np

from transformer.config.fields import TOKENIZERS as KINDS  # declared with data.tokenizer


class TokenizerError(ValueError):
    """Text the tokenizer cannot encode, or a tokenizer description it cannot load."""


class ByteTokenizer:
    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def to_json(self) -> dict:
        return {"kind": self.kind}


class CharTokenizer:
    kind = "char"

    def __init__(self, chars: str):
        if not chars:
            raise TokenizerError("a char tokenizer needs at least one character")
        self.chars = chars
        self.vocab_size = len(chars)
        self._ids = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as e:
            raise TokenizerError(
                f"character {e.args[0]!r} is not in this char tokenizer's vocabulary "
                f"({self.vocab_size} characters seen in the training corpus)") from None

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if 0 <= int(i) < self.vocab_size)

    def to_json(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}


class BPETokenizer:
    kind = "bpe"

    def __init__(self, tokenizer):
        self._tok = tokenizer  # a tokenizers.Tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, text: str, vocab_size: int) -> "BPETokenizer":
        """Learns merges on `text` until `vocab_size` tokens (fewer if the text runs out)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_chunks(text), trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_array(self, text: str) -> np.ndarray:
        # Pieces encode in parallel, with the same ids as one encode() of the whole text.
        ids = [e.ids for e in self._tok.encode_batch(list(_chunks(text)))]
        return np.fromiter((i for chunk in ids for i in chunk), dtype=np.int32)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])

    def to_json(self) -> dict:
        return {"kind": self.kind, "tokenizer": self._tok.to_str()}


def _chunks(text: str, lines: int = 256):
    """The text in pieces of about `lines` lines, cut only inside "x\ny" (a single newline
    between two non-space characters): byte-level pre-tokenization always makes that newline
    a token of its own, so encoding the pieces gives exactly the ids of the whole text."""
    pieces = re.split(r"(?<=\S\n)(?=\S)", text)
    for i in range(0, len(pieces), lines):
        yield "".join(pieces[i:i + lines])


def from_json(spec: dict):
    """Rebuilds a tokenizer saved with `to_json`."""
    kind = spec.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(spec["chars"])
    if kind == "bpe":
        from tokenizers import Tokenizer
        try:
            return BPETokenizer(Tokenizer.from_str(spec["tokenizer"]))
        except (KeyError, Exception) as e:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerError(f"a saved bpe tokenizer could not be loaded: {e}") from None
    raise TokenizerError(f"unknown tokenizer kind {kind!r}: expected one of {', '.join(KINDS)}")


def build(kind: str, text: str, bpe_vocab_size: int = 1024):
    """The tokenizer named by `data.tokenizer`, built from the training text if it needs it."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "bpe":
        return BPETokenizer.train(text, bpe_vocab_size)
    raise TokenizerError(f"unknown tokenizer {kind!r}: expected one of {', '.join(KINDS)}")

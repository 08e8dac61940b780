"""Text ↔ token ids. A tokenizer is saved with every checkpoint as a small JSON dict.

- `ByteTokenizer`: the UTF-8 bytes of the text, vocabulary 256. Needs no training and encodes
  any text (Chinese takes 3 bytes a character). The default.
- `CharTokenizer`: one id per distinct character of the training corpus (sorted), the classic
  char-level setup; text with a character it never saw is refused with the character named.
"""

from __future__ import annotations

import numpy as np


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


def from_json(spec: dict):
    """Rebuilds a tokenizer saved with `to_json`."""
    kind = spec.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(spec["chars"])
    raise TokenizerError(f"unknown tokenizer kind {kind!r}: expected byte or char")


def build(kind: str, text: str):
    """The tokenizer named by `data.tokenizer`, built from the training text if it needs it."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer.from_text(text)
    raise TokenizerError(f"unknown tokenizer {kind!r}: expected byte or char")

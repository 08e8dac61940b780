"""Text ↔ token ids. A tokenizer is saved with every checkpoint as a small JSON dict.

- `ByteTokenizer`: the UTF-8 bytes of the text, vocabulary 256. Needs no training and encodes
  any text (Chinese takes 3 bytes a character). The default. A prepared dataset
  (`python -m transformer prepare`, data/prepare.py) ends every document with an end-of-text
  token: its byte tokenizer has one more id, 256 (`<|endoftext|>`), vocabulary 257.
- `CharTokenizer`: one id per distinct character of the training corpus (sorted), the classic
  char-level setup; text with a character it never saw is refused with the character named.
- `BPETokenizer`: byte-level BPE (GPT-2's scheme) learned on the training text with the
  `tokenizers` library, `data.bpe_vocab_size` tokens. Encodes any text (unseen characters fall
  back to their bytes); the learned merges travel with the checkpoint inside its JSON.

Text is text: every tokenizer encodes a document's characters as ordinary text, as nanoGPT's
`encode_ordinary` does (a literal `<|endoftext|>` in it is 13 characters, never the end token),
and adds nothing around it (a tokenizer.json's post-processor, a Llama-style BOS, is not run;
nor its saved truncation or padding).
The end-of-text token is placed by whoever ends a document (prepare.py), never parsed.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np

from transformer.config.fields import TOKENIZERS as KINDS  # declared with data.tokenizer


class TokenizerError(ValueError):
    """Text the tokenizer cannot encode, or a tokenizer description it cannot load."""


EOT = "<|endoftext|>"  # the end-of-text token's text in every tokenizer.json we write


class ByteTokenizer:
    kind = "byte"

    def __init__(self, eot: bool = False):
        self.eot = 256 if eot else None  # the end-of-text id, after the 256 bytes
        self.vocab_size = 257 if eot else 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def to_json(self) -> dict:
        return {"kind": self.kind} if self.eot is None else {"kind": self.kind, "eot": self.eot}

    def hf_tokenizer(self):
        """The same encoding as a `tokenizers.Tokenizer` (what a prepared folder's
        tokenizer.json holds): GPT-2's byte-to-character map, no merges, so the ids are the
        bytes; `<|endoftext|>` is 256."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        chars = _bytes_to_unicode()
        tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        if self.eot is not None:
            tok.add_special_tokens([EOT])
        return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (what byte-level BPE works on)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(rest)}}


class CharTokenizer:
    kind = "char"

    def __init__(self, chars: str, eot: bool = False):
        if not chars:
            raise TokenizerError("a char tokenizer needs at least one character")
        self.chars = chars
        self.eot = len(chars) if eot else None  # the end-of-text id, after the characters
        self.vocab_size = len(chars) + bool(eot)
        self._ids = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str, eot: bool = False) -> "CharTokenizer":
        return cls("".join(sorted(set(text))), eot)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as e:
            raise TokenizerError(
                f"character {e.args[0]!r} is not in this char tokenizer's vocabulary "
                f"({len(self.chars)} characters seen in the training corpus)") from None

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if 0 <= int(i) < len(self.chars))

    def to_json(self) -> dict:
        spec = {"kind": self.kind, "chars": self.chars}
        return spec if self.eot is None else {**spec, "eot": self.eot}

    def hf_tokenizer(self):
        """The same encoding as a `tokenizers.Tokenizer`: every character a token of its own
        (a BPE model with no merges over single characters), `<|endoftext|>` after them."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        tok = Tokenizer(models.BPE(vocab=dict(self._ids), merges=[]))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.decoder = decoders.Fuse()
        if self.eot is not None:
            tok.add_special_tokens([EOT])
        return tok


class BPETokenizer:
    kind = "bpe"

    def __init__(self, tokenizer, eot: int | None = None):
        self._tok = tokenizer  # a tokenizers.Tokenizer
        # One past its largest id, not its count of tokens (get_vocab_size): a tokenizer.json
        # whose ids have gaps has ids past its count, which a model of that many rows, or a
        # uint16 shard chosen by it, would not hold.
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values(),
                              default=-1) + 1
        # The end-of-text id: None unless the set was prepared (prepare.py adds or finds one).
        self.eot = tokenizer.token_to_id(EOT) if eot is None else eot

    def hf_tokenizer(self):
        return self._tok

    @classmethod
    def train(cls, text, vocab_size: int, eot: bool = False) -> "BPETokenizer":
        """Learns merges on `text` (a string, or an iterable of documents) until `vocab_size`
        tokens (fewer if the text runs out); with `eot`, the last of them is `<|endoftext|>`."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - bool(eot), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_chunks(text) if isinstance(text, str) else text, trainer)
        if eot:
            tok.add_special_tokens([EOT])
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self.ordinary().encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def ordinary(self):
        """The tokenizer that encodes text as text (`ordinary`), made once."""
        if getattr(self, "_ordinary", None) is None:
            self._ordinary = ordinary(self._tok, self.eot)
        return self._ordinary

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])

    def to_json(self) -> dict:
        spec = {"kind": self.kind, "tokenizer": self._tok.to_str()}
        return spec if self.eot is None else {**spec, "eot": self.eot}


def _chunks(text: str, lines: int = 256):
    """The text in pieces of about `lines` lines, cut only inside "x\ny" (a single newline
    between two non-space characters): byte-level pre-tokenization always makes that newline
    a token of its own, so encoding the pieces gives exactly the ids of the whole text."""
    pieces = re.split(r"(?<=\S\n)(?=\S)", text)
    for i in range(0, len(pieces), lines):
        yield "".join(pieces[i:i + lines])


def ordinary(hf, eot: int | None = None):
    """A copy of the `tokenizers.Tokenizer` hf that takes every string in its input as text:
    its special tokens, and the end-of-text token `eot` even where the file does not mark it
    special, are not matched in the input (they stay in the vocabulary: decoding is
    unchanged), and no post-processor adds any; a truncation or padding saved in the file
    (a max_length of 512, a pad to it) is not applied: a text's ids are all of its ids, and
    only them. Encode with add_special_tokens=False."""
    from tokenizers import Tokenizer
    spec = json.loads(hf.to_str())
    spec["added_tokens"] = [t for t in spec.get("added_tokens") or []
                            if not t.get("special") and t.get("id") != eot]
    spec["post_processor"] = spec["truncation"] = spec["padding"] = None
    return Tokenizer.from_str(json.dumps(spec))


PROBE = ("def f(x):\n    return x  # a line\nclass A:\n pass\n\tcafé naïve 中文\nx = '  two'\n"
         "end.\n  indented\n")


def cut_keeps_ids(tokenizer, pieces=()) -> bool:
    """Whether encoding a text in pieces cut at "x\\ny" line boundaries (sources.py) gives the
    ids of the whole: always for byte and char (an id per byte or character); for a BPE,
    checked on `pieces` (consecutive pieces of a real text) and on a probe cut at each of its
    line boundaries. A ByteLevel pre-tokenizer passes (the newline is a pre-token of its own);
    a Metaspace one (Llama 2, Mistral, T5) does not (it prefixes every piece's first word)."""
    if tokenizer.kind in ("byte", "char"):
        return True
    probe = re.split(r"(?<=\S\n)(?=\S)", PROBE)
    for texts in (probe, list(pieces)):
        if len(texts) < 2:
            continue
        alone = [i for t in texts for i in tokenizer.encode(t)]
        if alone != tokenizer.encode("".join(texts)):
            return False
    return True


def fingerprint(tokenizer) -> str:
    """A short hash of what the tokenizer does (its saved JSON): two tokenizers with the same
    fingerprint give the same ids for every text."""
    spec = json.dumps(tokenizer.to_json(), sort_keys=True).encode()
    return hashlib.sha256(spec).hexdigest()[:16]


def from_json(spec: dict):
    """Rebuilds a tokenizer saved with `to_json`."""
    kind = spec.get("kind")
    if kind == "byte":
        return ByteTokenizer(eot=spec.get("eot") is not None)
    if kind == "char":
        return CharTokenizer(spec["chars"], eot=spec.get("eot") is not None)
    if kind == "bpe":
        from tokenizers import Tokenizer
        try:
            return BPETokenizer(Tokenizer.from_str(spec["tokenizer"]), spec.get("eot"))
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

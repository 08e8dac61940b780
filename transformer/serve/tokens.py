"""Tokens as OpenAI's logprobs give them: a token is a string when its bytes are whole UTF-8
characters, and `bytes:\\xNN...` when they are not (a byte tokenizer's piece of 中, a
byte-level BPE token that ends mid-character), as OpenAI's and vLLM's servers write it; the
end-of-text token is its name. `text_offset` is where each token starts in the text, in
characters: a token that begins inside a character points at that character.

    names = TokenNames(tokenizer)
    names(id) -> "the" | "bytes:\\xe4\\xb8" | "<|endoftext|>"
    names.offsets(ids) -> [0, 0, 0, 1, ...]

Decoding each token alone gives every partial character as U+FFFD: "é中" came back as five
"\\ufffd" with offsets [0, 1, 2, 3, 4], and alternatives that are different bytes collapsed
into one key of top_logprobs.
"""

from __future__ import annotations

import codecs

from transformer.data.tokenizers import EOT, _bytes_to_unicode


class TokenNames:
    def __init__(self, tokenizer):
        self.tokenizer, self.eot = tokenizer, getattr(tokenizer, "eot", None)
        self._bytes = self._bytes_function(tokenizer)

    def _bytes_function(self, tokenizer):
        """id -> the token's bytes in the text (None: a special token, no text)."""
        kind = getattr(tokenizer, "kind", None)
        if kind == "byte":
            return lambda i: bytes([i]) if 0 <= i < 256 else None
        if kind == "char":
            return lambda i: tokenizer.chars[i].encode() if 0 <= i < len(tokenizer.chars) \
                else None
        hf = tokenizer.hf_tokenizer() if kind == "bpe" else None
        decoder = (hf.decoder.__class__.__name__ if hf is not None and hf.decoder else "")
        if decoder == "ByteLevel":  # GPT-2's scheme: each character of a token is one byte
            inverse = {c: b for b, c in _bytes_to_unicode().items()}
            special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}

            def byte_level(i):
                piece = hf.id_to_token(i)
                if piece is None or i in special:
                    return None
                try:
                    return bytes(inverse[c] for c in piece)
                except KeyError:  # an added token that is plain text
                    return piece.encode()
            return byte_level
        # Another scheme (e.g. a sentencepiece-style tokenizer.json): its own decoding of the
        # one token, which cannot show part of a character.
        return lambda i: tokenizer.decode([i]).encode() or None

    def bytes(self, token_id: int) -> bytes | None:
        return self._bytes(int(token_id))

    def __call__(self, token_id: int) -> str:
        token_id = int(token_id)
        raw = self._bytes(token_id)
        if raw is None:
            if token_id == self.eot and getattr(self.tokenizer, "kind", None) != "bpe":
                return EOT  # a BPE's end token has its own name (a folder's </s>)
            hf = getattr(self.tokenizer, "hf_tokenizer", None)
            name = hf().id_to_token(token_id) if hf is not None else None
            return name or f"token_id:{token_id}"
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def offsets(self, ids, restart: int | None = None) -> list[int]:
        """Where each token starts in the text of `ids`, in characters: the characters
        already complete when its first byte comes (a UTF-8 decoder fed token by token).
        `restart`: the index where a second text begins, decoded on its own and joined to the
        first (an echoed prompt and its completion): a character the first leaves unfinished
        is its last character there (U+FFFD), not finished by the second's bytes."""
        decoder, done, out = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0, []
        for k, i in enumerate(ids):
            if k == restart:
                done += len(decoder.decode(b"", final=True))
                decoder.reset()
            out.append(done)
            done += len(decoder.decode(self._bytes(int(i)) or b""))
        return out

    def pieces(self, ids) -> list[str]:
        """Each token's share of the text of `ids`: the characters its bytes complete (a
        UTF-8 decoder fed token by token), so that the pieces join into the text; a token
        that starts a character of several bytes is "", the one that ends it holds it. A
        special token (no bytes) is its name."""
        decoder, out = codecs.getincrementaldecoder("utf-8")(errors="replace"), []
        for i in ids:
            raw = self._bytes(int(i))
            out.append(self(i) if raw is None else decoder.decode(raw))
        return out

    def top(self, ids, values) -> dict:
        """OpenAI's top_logprobs entry: name -> log-probability, likeliest first. Two tokens
        with one name (only possible for special or unmapped tokens) are kept apart by id."""
        out = {}
        for i, v in zip(ids, values):
            name = self(i)
            out[f"token_id:{int(i)}" if name in out else name] = float(v)
        return out


def logprobs(names: TokenNames, text_ids, first: int, lp, completion: int | None = None) -> dict:
    """OpenAI's logprobs object for text_ids[first:] (`lp`: inside.token_logprobs of all of
    text_ids); the very first token of a text has no log-probability. `completion`: where the
    completion begins in text_ids, when its text is decoded apart from the prompt's (offsets
    count the prompt's text as the answer gives it). Each top_logprobs entry
    is the likeliest alternatives, then the token itself where it is not among them: OpenAI
    "will always return the logprob of the sampled token, so there may be up to logprobs+1
    elements" (vLLM too)."""
    tokens, token_lp, top_lp = [], [], []
    for t in range(first, len(text_ids)):
        tokens.append(names(text_ids[t]))
        if t == 0:
            token_lp.append(None)
            top_lp.append(None)
            continue
        token_lp.append(float(lp.chosen_T[t - 1]))
        ids_K, values_K = list(lp.top_ids_TK[t - 1]), list(lp.top_lp_TK[t - 1])
        if int(text_ids[t]) not in map(int, ids_K):
            ids_K.append(text_ids[t])
            values_K.append(lp.chosen_T[t - 1])
        top_lp.append(names.top(ids_K, values_K))
    return {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": top_lp,
            "text_offset": names.offsets(text_ids[first:], None if completion is None
                                         else completion - first)}

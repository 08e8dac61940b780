"""Scores an evaluation harness can trust on text that is not ASCII, against a real server on
a byte-level run: every expectation is built here from the text's UTF-8 bytes and the
model's own forward pass (GPT.apply), not the way the server builds its answer.

A byte of a character is not a character: such a token is `bytes:\\xNN` (as OpenAI and vLLM
write it), text_offset is the index of the character the token's first byte belongs to, and
top_logprobs keeps apart alternatives that would all decode to U+FFFD. The old server gave
"é中" as five "\\ufffd" tokens at offsets [0, 1, 2, 3, 4] and merged such alternatives.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.serve_run import byte_run, model_logprobs, server

openai = pytest.importorskip("openai")

TEXTS = ["é中", "быстрая лиса прыгает", "敏捷的棕色狐狸", "the 中文 fox и собака"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return byte_run(tmp_path_factory)


@pytest.fixture(scope="module")
def client(workdir):
    # one row: the requests come one at a time (batching is test_serve_batching's), and a
    # server warms up (traces, lowers, compiles) every row bucket's programs
    with server(workdir, "--max_batch=1", max_tokens=32) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def byte_name(b: int) -> str:
    """A byte token's name, from UTF-8 itself: a character only if the byte is one (ASCII)."""
    if b == 256:
        return "<|endoftext|>"
    return chr(b) if b < 0x80 else f"bytes:\\x{b:02x}"


def joined_bytes(tokens) -> bytes:
    out = b""
    for t in tokens:
        if t.startswith("bytes:"):
            out += bytes(int(h, 16) for h in t[len("bytes:"):].split("\\x")[1:])
        else:
            out += t.encode()
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_echo_logprobs_name_partial_characters_by_their_bytes(workdir, client, text):
    reply = client.completions.create(model="tiny", prompt=text, max_tokens=0, echo=True,
                                      logprobs=5)
    [c] = reply.choices
    lp = c.logprobs
    raw = text.encode()
    assert c.text == text
    assert lp.tokens == [byte_name(b) for b in raw]
    assert joined_bytes(lp.tokens) == raw  # the tokens join back to the text
    # Character i of the text covers len(its UTF-8) tokens, all at offset i.
    assert lp.text_offset == [i for i, ch in enumerate(text) for _ in ch.encode()]
    assert all(text[o] == ch for o, ch in zip(lp.text_offset, (
        ch for ch in text for _ in ch.encode())))
    expected, logp, _ = model_logprobs(workdir, list(raw))
    assert lp.token_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:], expected, atol=2e-4)
    for t, top in enumerate(lp.top_logprobs[1:]):
        best = np.argsort(-logp[t])[:5]
        # five alternatives, even where several are parts of characters; then the token
        # itself where it is not among them (OpenAI: up to logprobs + 1 entries)
        assert list(top)[:5] == [byte_name(int(i)) for i in best]
        np.testing.assert_allclose(list(top.values())[:5], logp[t][best], atol=2e-4)
        assert len(top) == 5 + (raw[t + 1] not in best)
        assert top[lp.tokens[t + 1]] == pytest.approx(lp.token_logprobs[t + 1], abs=1e-6)
    assert sum(not t.startswith("bytes:") for t in lp.tokens) < len(lp.tokens)


def test_e_acute_zhong_is_five_byte_tokens_over_two_characters(client):
    [c] = client.completions.create(model="tiny", prompt="é中", max_tokens=0, echo=True,
                                    logprobs=1).choices
    assert c.logprobs.tokens == ["bytes:\\xc3", "bytes:\\xa9", "bytes:\\xe4", "bytes:\\xb8",
                                 "bytes:\\xad"]
    assert c.logprobs.text_offset == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("prompt", ["лиса ", "狐狸"])
def test_generated_tokens_join_to_the_completion_and_score_as_the_model(workdir, client,
                                                                         prompt):
    [c] = client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                    temperature=1.0, seed=4, logprobs=3).choices
    lp = c.logprobs
    made = joined_bytes(lp.tokens)
    assert len(lp.tokens) == 24 and made.decode("utf-8", errors="replace") == c.text
    expected, _, _ = model_logprobs(workdir, list(prompt.encode() + made))
    np.testing.assert_allclose(lp.token_logprobs, expected[-24:], atol=2e-4)
    # Offsets count the characters of the completion before each token's first byte.
    for k, offset in enumerate(lp.text_offset):
        before = made[:len(joined_bytes(lp.tokens[:k]))]
        whole = before.decode("utf-8", errors="replace")
        # a character still unfinished at that point is where the token starts
        assert offset == len(whole) - whole.endswith("\ufffd") * _unfinished(before)


def _unfinished(data: bytes) -> bool:
    """Whether `data` ends inside a UTF-8 character that more bytes could still finish: its
    last lead byte (within the last 4) begins a valid, unfinished sequence."""
    for p in range(len(data) - 1, max(len(data) - 5, -1), -1):
        if data[p] & 0xC0 != 0x80:
            try:
                data[p:].decode("utf-8")
                return False
            except UnicodeDecodeError as e:
                return e.start == 0 and e.reason == "unexpected end of data"
    return False


def test_inspect_lays_out_a_text_as_pieces_that_join_into_it():
    """/v1/inspect's tokens are what the page lays out: each token's share of the text, so a
    Cyrillic or Chinese character (2-3 byte tokens) reads as itself, not as one U+FFFD per
    byte, and the pieces join into the text; the next-token list names a partial character
    by its bytes, as logprobs do, so two different bytes do not look alike."""
    from types import SimpleNamespace

    from transformer.data import tokenizers
    from transformer.serve.engine import Engine
    from transformer.serve.tokens import TokenNames

    tokenizer = tokenizers.ByteTokenizer()
    text = "лиса fox é中"
    ids = tokenizer.encode(text)
    laid_out = Engine.inspect_tokens(SimpleNamespace(tokenizer=tokenizer,
                                                     names=TokenNames(tokenizer)), ids)
    assert laid_out["ids"] == ids and len(laid_out["tokens"]) == len(ids)
    assert "".join(laid_out["tokens"]) == text
    assert laid_out["tokens"][:2] == ["", "л"]


def test_echo_offsets_of_a_prompt_of_ids_ending_inside_a_character(client):
    """A prompt of token ids may end inside a character ("a" and the first byte of é): the
    echoed text is the prompt's text (ending in U+FFFD) and then the completion's, so each
    completion token's offset is the prompt's length in characters plus its offset in the
    completion alone. The offsets were one short: they let the completion's bytes finish
    the prompt's character."""
    prompt = list(b"a\xc3")
    args = dict(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
    [alone] = client.completions.create(**args).choices
    [echo] = client.completions.create(echo=True, **args).choices
    head = bytes(prompt).decode("utf-8", errors="replace")
    assert head == "a\ufffd" and echo.text == head + alone.text
    assert echo.logprobs.tokens == ["a", "bytes:\\xc3"] + alone.logprobs.tokens
    assert echo.logprobs.text_offset == [0, 1] + [len(head) + o
                                                  for o in alone.logprobs.text_offset]

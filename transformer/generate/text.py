"""Text in, text out, around `decode.generate` (which works on token ids): encode the prompt,
decode the continuations, and stream one sample's text as its tokens are made.

    texts = textgen.sample_text(model_config, params, tokenizer, "def ", max_new_tokens=200)
    textgen.sample_text(..., on_text=print_piece)   # pieces of sample 0 as they come

A token can end part-way through a character (a byte tokenizer's 3-byte Chinese character,
a byte-level BPE token): `TextStream` holds such bytes back until the character is complete,
so a stream never shows a replacement character that the whole text would not show.
"""

from __future__ import annotations

import sys

from transformer.config import ModelConfig
from transformer.data.tokenizers import TokenizerError
from transformer.generate import decode

REPLACEMENT = "\ufffd"


def text_after(tokenizer, context, ids) -> str:
    """The text `ids` add after the ids `context`: decode(context + ids) less decode(context).
    For byte, char and byte-level BPE tokenizers that is decode(ids); a sentencepiece-style
    decoder (Metaspace, or Llama 2's Replace + Strip) drops the space of a word that starts
    the text it decodes, so "▁world" alone is "world", while after "hello" it is " world".
    A context whose text is not whole characters (a replacement character: bytes that the
    ids might complete) is not used: its text would change, not be continued."""
    ids = [int(i) for i in ids]
    if not context:
        return tokenizer.decode(ids)
    context = [int(i) for i in context]
    before = tokenizer.decode(context)
    whole = tokenizer.decode(context + ids) if REPLACEMENT not in before else ""
    return whole[len(before):] if whole.startswith(before) and whole else tokenizer.decode(ids)


def _concatenative(tokenizer) -> bool:
    """Whether the text of ids after whole characters is their own text whatever came before:
    byte and char tokenizers, and BPE with GPT-2's byte-level decoder."""
    kind = getattr(tokenizer, "kind", None)
    if kind in ("byte", "char"):
        return True
    hf = tokenizer.hf_tokenizer() if kind == "bpe" else None
    return hf is not None and type(hf.decoder).__name__ == "ByteLevel"


class TextStream:
    """Token ids in, text out, piece by piece: the concatenated pieces equal
    `text_after(tokenizer, context, all ids)`, `tokenizer.decode(all ids)` without a context
    (`context`: the ids before them, a prompt's). Works with any tokenizer that has
    `decode(ids)`: it decodes only the ids not yet shown, after the last CONTEXT ids before
    them (a sentencepiece-style decoder spells a word's space only after another token),
    and holds them while their text ends in a replacement character (an unfinished UTF-8
    sequence, or an invalid one that the next byte may still turn out to end); text that
    ends in a whole character cannot change with later tokens. `finish` gives whatever is
    left.

    The held ids stay few, so each token costs the same however long the stream: once more
    than HOLD are held (invalid bytes that never become a character), the longest head whose
    text is final is given out, a head whose text joined to the rest's is the text of all
    (an unfinished character cut in two would decode to one more replacement character)."""

    HOLD = 8
    CONTEXT = 4

    def __init__(self, tokenizer, context=()):
        self.tokenizer, self.held = tokenizer, []
        # Byte, char and byte-level BPE text does not depend on what came before: no context
        # to decode (one decode a token, as before).
        self.keep = 0 if _concatenative(tokenizer) else self.CONTEXT
        self.context = [int(i) for i in context][-self.keep:] if self.keep else []

    def _text(self, ids, before=()) -> str:
        if not self.keep:
            return self.tokenizer.decode(ids)
        return text_after(self.tokenizer, (self.context + list(before))[-self.keep:], ids)

    def _shown(self, ids) -> None:
        if self.keep:
            self.context = (self.context + list(ids))[-self.keep:]

    def push(self, token_id: int) -> str:
        self.held.append(int(token_id))
        text = self._text(self.held)
        if not text.endswith(REPLACEMENT):
            self._shown(self.held)
            self.held = []
            return text
        if len(self.held) <= self.HOLD:
            return ""
        for k in range(len(self.held) - 1, 0, -1):  # at most HOLD decodes of HOLD ids
            head = self._text(self.held[:k])
            if head + self._text(self.held[k:], self.held[:k]) == text:
                self._shown(self.held[:k])
                self.held = self.held[k:]
                return head
        return ""

    def push_many(self, token_ids) -> str:
        """The pieces `push` gives for each of token_ids, joined. One decode for all of them
        when nothing is held, the tokenizer's text is its tokens' texts joined (byte, char)
        and theirs holds no replacement character (then every push would have given its
        text at once); else token by token. A server's chunk of 16 tokens cost ~9.5 µs a
        token pushed one by one (a loaded 2-vCPU Sapphire Rapids)."""
        if not self.held and getattr(self.tokenizer, "kind", None) in ("byte", "char"):
            text = self.tokenizer.decode(token_ids)
            if REPLACEMENT not in text:
                self._shown(token_ids)
                return text
        return "".join(self.push(t) for t in token_ids)

    def finish(self) -> str:
        text = self._text(self.held) if self.held else ""
        self._shown(self.held)
        self.held = []
        return text


def encode_prompt(tokenizer, prompt: str, max_seq_len: int, log=None) -> list[int]:
    """The prompt's token ids; one longer than the context is cut to its last max_seq_len
    tokens, with a one-line notice through `log` (default: stderr). A tokenizer with
    `prefix_ids` (a Hugging Face folder's BOS, hf/load.starting_at) has them first, as
    `transformers`' tokenizer(prompt) does; a cut prompt keeps them."""
    prefix = [int(i) for i in getattr(tokenizer, "prefix_ids", ())][:max_seq_len - 1]
    ids = tokenizer.encode(prompt)
    room = max_seq_len - len(prefix)
    if len(ids) > room:
        log = log or (lambda message: print(message, file=sys.stderr))
        log(f"note: the prompt is {len(prefix) + len(ids)} tokens and the model's context "
            f"{max_seq_len}: continuing from its last {room} tokens"
            + (" after its BOS" if prefix else ""))
        ids = ids[-room:]
    return prefix + ids


def stop_strings(stop) -> list[str]:
    """`stop` as a list of non-empty strings: None, one string, or several (as the OpenAI
    API's `stop`)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    for s in stops:
        if not isinstance(s, str) or not s:
            raise decode.PromptError(f"stop={s!r}: each stop must be a non-empty string")
    return stops


def cut_at_stop(text: str, stops) -> str:
    """`text` up to (not including) the stop string that the text completes first, reading
    it from the start (of two completed by the same character, the longer); all of it if
    none matches. OpenAI's semantics: the returned text never contains a stop string. "The
    first completed", not "the first to begin": a sample streamed piece by piece stops when
    a stop string is complete, so with stops "xyz" and "y" the text "abxyz" ends at "abx"
    whatever the pieces (the earliest start gave "ab" for the whole text and "abx" for
    pieces of one character)."""
    found = [(i + len(s), i) for s in stop_strings(stops) if (i := text.find(s)) >= 0]
    return text[:min(found)[1]] if found else text


class StopText:
    """Text pieces in, the part that may be shown out, for one sample: nothing at or after
    the first stop string, and the tail that could still begin one is held back until the
    next piece decides (a stop may span pieces). `stopped` turns True at the first match.

    Linear in the text: only the held-back tail and the new piece are searched. Text already
    shown can hold no match, nor the start of one: a stop beginning there would either lie
    wholly inside the text seen (and have been found) or begin with the text's end (and
    have been held back). `text` is all the text pushed, `shown` how much of it was given."""

    def __init__(self, stops):
        self.stops, self.stopped = stop_strings(stops), False
        self.hold = max(map(len, self.stops), default=1) - 1
        self._shown, self._tail, self._dropped = [], "", []  # given; held back; past a stop
        self.shown = 0

    @property
    def text(self) -> str:
        return "".join(self._shown) + self._tail + "".join(self._dropped)

    def push(self, piece: str) -> str:
        if self.stopped:
            self._dropped.append(piece)
            return ""
        text = self._tail + piece
        cut = cut_at_stop(text, self.stops)
        if len(cut) < len(text):
            self.stopped = True
            safe = len(cut)
        else:
            safe = max(len(text) - self.hold, 0)
            # Hold back only a tail that begins some stop string.
            while safe < len(text) and not any(s.startswith(text[safe:]) for s in self.stops):
                safe += 1
        out, self._tail = text[:safe], text[safe:]
        if self.stopped:
            self._dropped.append(self._tail)
            self._tail = ""
        self._shown.append(out)
        self.shown += len(out)
        return out

    def finish(self) -> str:
        """What is left once the sample has ended without a stop: the held-back tail."""
        if self.stopped:
            return ""
        out, self._tail = self._tail, ""
        self._shown.append(out)
        self.shown += len(out)
        return out


def stop_id(tokenizer, stop) -> int:
    """The end token that stops exactly where the text `stop` first appears, or -1 when
    stopping needs the text (the host checks it, `sample_text`). Only one character that is
    always one token of its own (a byte or char tokenizer) qualifies: with BPE, a newline is
    also inside longer tokens ("\n    "), and a longer string may span tokens."""
    stops = stop_strings(stop)
    if len(stops) != 1 or len(stops[0]) != 1 or \
            getattr(tokenizer, "kind", None) not in ("byte", "char"):
        return -1
    try:
        ids = tokenizer.encode(stops[0])
    except TokenizerError:  # a character the char tokenizer lacks: the text never holds it
        return -1
    return ids[0] if len(ids) == 1 else -1


def precompile_sample(model_config: ModelConfig, params, tokenizer, prompt: str, *,
                      num_samples: int = 1, max_new_tokens: int = 100, mesh, rules) -> None:
    """Compiles the program `sample_text` runs for these arguments with `mesh` and `rules`
    (any seed and sampling knobs; `params`: arrays or their jax.ShapeDtypeStructs), so that
    call finds it compiled. Raises what sample_text would for a prompt it cannot use."""
    prompt_ids = encode_prompt(tokenizer, prompt, model_config.max_seq_len, lambda _: None)
    decode.precompile(model_config, params, [prompt_ids] * num_samples,
                      max_new_tokens=max_new_tokens, mesh=mesh, rules=rules)


def end_ids(tokenizer) -> frozenset:
    """Every token that ends a sample: the tokenizer's end-of-text token (`eot`, the one the
    device stops at) and any others a Hugging Face folder names (`end_ids`, set by
    hf/load.ending_at: Llama 3.1's generation_config.json lists <|end_of_text|>, <|eom_id|>
    and <|eot_id|>), which the host checks."""
    eot = getattr(tokenizer, "eot", None)
    return frozenset(({int(eot)} if eot is not None else set())
                     | {int(i) for i in getattr(tokenizer, "end_ids", ())})


def _cut_at_end(row, ends) -> list:
    """The row's tokens before the first of `ends`."""
    return row[:next((k for k, t in enumerate(row) if t in ends), len(row))]


def sample_text(model_config: ModelConfig, params, tokenizer, prompt: str, *, num_samples: int = 1,
                max_new_tokens: int = 100, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, seed: int = 0, stop=None, end_at_eot: bool = True,
                mesh=None, rules=None, on_text=None, log=None) -> list[str]:
    """`num_samples` continuations of `prompt` (decoded in one batch). Raises PromptError or
    TokenizerError for a prompt that cannot be used. `stop`: a string or a list of strings;
    each sample ends before the first match of any (OpenAI's `stop`). A single character that
    is one token (byte, char tokenizers) ends a row on the device; any other stop is checked
    on the host as tokens stream out (every step.STREAM_EVERY tokens), and the device stops
    a row within that many tokens of its match (on a mesh, samples are only cut afterwards).
    `on_text(piece)`: called with sample 0's text as it is produced (one device only); it
    may return False to end every sample there (its reader went away: a closed pipe).
    `end_at_eot`: a sample also ends where the model makes the tokenizer's end-of-text token
    (or any of its end tokens, `end_ids`: the others are checked on the host as stop strings
    are).
    `mesh`, `rules`: decode on a device mesh (see decode.generate). `log`: where the notice
    about a prompt longer than the context goes (default: stderr)."""
    stops = stop_strings(stop)
    prompt_ids = encode_prompt(tokenizer, prompt, model_config.max_seq_len, log)
    # A sample ends where the model ends its document (the end-of-text token every document
    # was trained with), as GPT-2 and OpenAI's API do; then the device's one end token is
    # that, and stop strings are the host's to check.
    eot = getattr(tokenizer, "eot", None) if end_at_eot else None
    eos_id = stop_id(tokenizer, stops) if eot is None else eot
    ends = end_ids(tokenizer) if end_at_eot else frozenset()
    on_tokens = None
    watch = stops if (eot is not None or eos_id == -1) and mesh is None else []  # host checks
    others = ends - {eos_id} if mesh is None else frozenset()  # end tokens the host checks
    if on_text is not None or watch or others:
        streams = [TextStream(tokenizer, prompt_ids)
                   for _ in range(num_samples if watch or others else 1)]
        cuts = [StopText(watch) for _ in streams]
        ended, gone = [False] * len(streams), [False]

        def on_tokens(i, tokens_B, done_B):
            for b, (stream, cut) in enumerate(zip(streams, cuts)):
                if done_B[b] or cut.stopped or ended[b]:
                    continue
                if int(tokens_B[b]) in others:  # one of the folder's other end tokens
                    ended[b] = True
                    continue
                piece = cut.push(stream.push(tokens_B[b]))
                if b == 0 and piece and on_text is not None and not gone[0]:
                    gone[0] = on_text(piece) is False
            if gone[0]:  # on_text's reader went away: every sample ends here
                return False
            return [cut.stopped or e for cut, e in zip(cuts, ended)] + \
                [False] * (num_samples - len(cuts))

    rows = decode.generate(model_config, params, [prompt_ids] * num_samples,
                           max_new_tokens=max_new_tokens, seed=seed, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_id=eos_id, mesh=mesh,
                           rules=rules, on_tokens=on_tokens)
    if on_text is not None and not cuts[0].stopped and not gone[0]:
        piece = cuts[0].push(streams[0].finish()) + cuts[0].finish()
        if piece:
            on_text(piece)
    # The text each continuation adds after the prompt (a sentencepiece-style decoder spells
    # the space of a first word that continues the prompt's text), before its first end
    # token (the device cut at eos_id only).
    return [cut_at_stop(text_after(tokenizer, prompt_ids[-TextStream.CONTEXT:],
                                   _cut_at_end(row, ends)), stops)
            for row in rows]

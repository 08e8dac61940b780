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
from transformer.generate import decode

REPLACEMENT = "\ufffd"


class TextStream:
    """Token ids in, text out, piece by piece: the concatenated pieces equal
    `tokenizer.decode(all ids)`. Works with any tokenizer that has `decode(ids)`: it decodes
    only the ids not yet shown, and holds them while their text ends in a replacement
    character (an unfinished UTF-8 sequence, or an invalid one that the next byte may
    still turn out to end); text that ends in a whole character cannot change with later
    tokens. `finish` gives whatever is left."""

    def __init__(self, tokenizer):
        self.tokenizer, self.held = tokenizer, []

    def push(self, token_id: int) -> str:
        self.held.append(int(token_id))
        text = self.tokenizer.decode(self.held)
        if text.endswith(REPLACEMENT):
            return ""
        self.held = []
        return text

    def finish(self) -> str:
        text = self.tokenizer.decode(self.held) if self.held else ""
        self.held = []
        return text


def encode_prompt(tokenizer, prompt: str, max_seq_len: int, log=None) -> list[int]:
    """The prompt's token ids; one longer than the context is cut to its last max_seq_len
    tokens, with a one-line notice through `log` (default: stderr)."""
    ids = tokenizer.encode(prompt)
    if len(ids) > max_seq_len:
        log = log or (lambda message: print(message, file=sys.stderr))
        log(f"note: the prompt is {len(ids)} tokens and the model's context {max_seq_len}: "
            f"continuing from its last {max_seq_len} tokens")
        ids = ids[-max_seq_len:]
    return ids


def stop_id(tokenizer, stop: str | None) -> int:
    """The token id of `stop` (text of exactly one token), or -1 for none."""
    if not stop:
        return -1
    stop_ids = tokenizer.encode(stop)
    if len(stop_ids) != 1:
        raise decode.PromptError(f"stop={stop!r} is {len(stop_ids)} tokens; it must be one token")
    return stop_ids[0]


def sample_text(model_config: ModelConfig, params, tokenizer, prompt: str, *, num_samples: int = 1,
                max_new_tokens: int = 100, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, seed: int = 0, stop: str | None = None, mesh=None,
                rules=None, on_text=None, log=None) -> list[str]:
    """`num_samples` continuations of `prompt` (decoded in one batch). Raises PromptError or
    TokenizerError for a prompt that cannot be used. `stop`: text of one token that ends a
    sample. `on_text(piece)`: called with sample 0's text as it is produced (one device
    only). `mesh`, `rules`: decode on a device mesh (see decode.generate). `log`: where the
    notice about a prompt longer than the context goes (default: stderr)."""
    prompt_ids = encode_prompt(tokenizer, prompt, model_config.max_seq_len, log)
    on_tokens = None
    if on_text is not None:
        stream = TextStream(tokenizer)

        def on_tokens(i, tokens_B, done_B):
            if not done_B[0]:
                piece = stream.push(tokens_B[0])
                if piece:
                    on_text(piece)

    rows = decode.generate(model_config, params, [prompt_ids] * num_samples,
                           max_new_tokens=max_new_tokens, seed=seed, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_id=stop_id(tokenizer, stop), mesh=mesh,
                           rules=rules, on_tokens=on_tokens)
    if on_text is not None:
        piece = stream.finish()
        if piece:
            on_text(piece)
    return [tokenizer.decode(row) for row in rows]

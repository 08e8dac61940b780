"""OpenAI's chat completions on a model that continues text: the messages become one prompt
through a chat template, and the reply is that prompt's completion.

    POST /v1/chat/completions
      messages     [{"role": "system" | "developer" | "user" | "assistant", "content": ...}],
                   content a string or a list of {"type": "text", "text": ...} parts
      max_completion_tokens (or max_tokens; default: the server's --max_tokens, as OpenAI's
      chat has no default limit), temperature, top_p, top_k, seed, stop, n,
      stream (chunks with a `delta`), stream_options.include_usage: as in completions

The template: a Hugging Face folder (`serve --hf`) whose tokenizer_config.json has a
`chat_template` uses it (Jinja, rendered as transformers renders it, sandboxed). A run
trained here has none and gets the plain template, one line per message and an open
assistant line for the model to continue:

    system: You are terse.
    user: Name a colour.
    assistant:

With the plain template a reply also ends where the model starts another turn's line
(`\\nuser:` and the other roles: extra stop strings), besides its end-of-text token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from pathlib import Path

from transformer.serve import api
from transformer.serve.api import ApiError

ROLES = ("system", "developer", "user", "assistant")
PLAIN_STOPS = tuple(f"\n{role}:" for role in ROLES)
MAX_MESSAGES = 1024


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """`jinja`: a Hugging Face chat template's source, or None for the plain template.
    `split_specials`: the folder's tokenizer_config.json sets split_special_tokens (ours do:
    text spelling <|endoftext|> is text), so transformers encodes even the special tokens its
    template writes as their spelling, and so does the server."""
    jinja: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    split_specials: bool = False

    @property
    def stops(self) -> tuple:
        return () if self.jinja else PLAIN_STOPS

    def render(self, messages: list[dict]) -> str:
        if self.jinja is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return _jinja(self.jinja).render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token)

    def encode(self, tokenizer, prompt: str) -> list[int]:
        """A rendered prompt's token ids. The plain template's are its text's; a folder's
        template writes its model's special tokens (bos_token, <|im_start|>, ...), which are
        those tokens, as transformers' apply_chat_template encodes them, not their spelling
        as text. Raises the tokenizer's TokenizerError (a ValueError)."""
        if self.jinja is None or self.split_specials:
            return tokenizer.encode(prompt)
        return encode_with_specials(tokenizer, prompt)


@functools.lru_cache(maxsize=8)
def _specials(tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens, text -> id (ours: <|endoftext|>)."""
    hf = tokenizer.hf_tokenizer()
    return {t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special}


def encode_with_specials(tokenizer, text: str) -> list[int]:
    """`text`'s ids with each special token's text as that token and the text between them
    encoded as text (what a Hugging Face tokenizer does with its added tokens)."""
    specials = _specials(tokenizer)
    if not specials:
        return tokenizer.encode(text)
    ids, at = [], 0
    for match in re.finditer("|".join(map(re.escape, sorted(specials, key=len, reverse=True))),
                             text):
        ids += tokenizer.encode(text[at:match.start()]) if match.start() > at else []
        ids.append(specials[match.group()])
        at = match.end()
    return ids + (tokenizer.encode(text[at:]) if at < len(text) else [])


def _jinja(source: str):
    # As transformers renders chat templates: a sandbox (a template is code from the folder),
    # blocks trimmed, and raise_exception for the templates that check their input.
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def template_of(folder) -> ChatTemplate:
    """The chat template of a Hugging Face folder's tokenizer_config.json; the plain one when
    it has none (or the folder is None)."""
    path = Path(folder) / "tokenizer_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return ChatTemplate()
    spec = json.loads(path.read_text())
    source = spec.get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str):
        return ChatTemplate()

    def token(name):
        value = spec.get(name) or ""
        return value.get("content", "") if isinstance(value, dict) else value

    return ChatTemplate(source, token("bos_token"), token("eos_token"),
                        spec.get("split_special_tokens") is True)


def _content(i: int, content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(f"messages[{i}].content: only text parts ({{\"type\": \"text\", "
                               f"\"text\": ...}}) are supported, got type {part.get('type')!r}",
                               "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"messages[{i}].content: must be a string or a list of text parts",
                   "messages")


def _messages(body) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages: give a non-empty list of {\"role\", \"content\"} objects",
                       "messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(f"messages: at most {MAX_MESSAGES}, got {len(messages)}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(f"messages[{i}]: must be an object with role and content", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(f"messages[{i}].role={role!r}: must be one of {', '.join(ROLES)} "
                           "(tools are not supported)", "messages")
        if m.get("tool_calls") or m.get("function_call"):
            raise ApiError(f"messages[{i}]: tool calls are not supported by this server",
                           "messages")
        content = _content(i, m.get("content"))
        api.check_unicode(content, f"messages[{i}].content", "messages")
        out.append({"role": role, "content": content})
    return out


def parse_chat(body, max_tokens_limit: int, template: ChatTemplate):
    """A chat request body checked: (the CompletionRequest of its one prompt, the messages)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    api._refuse_unsupported(body, (
        ("logit_bias", None), ("presence_penalty", 0), ("frequency_penalty", 0),
        ("tools", None), ("functions", None), ("function_call", None), ("audio", None),
        ("prediction", None), ("top_logprobs", None)))
    api._flags(body, ("stream", "logprobs"))
    if body.get("logprobs"):
        raise ApiError("logprobs is not supported for chat by this server: score text with "
                       "/v1/completions (echo and logprobs)", "logprobs")
    if body.get("tool_choice") not in (None, "none"):
        raise ApiError("tool_choice is not supported by this server: leave it out",
                       "tool_choice")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError("response_format: only {\"type\": \"text\"} is supported",
                       "response_format")
    messages = _messages(body)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    # OpenAI's chat has no default limit (16 is the legacy completions' default): a reply
    # runs to its end, a stop, or the most this server gives one choice.
    sampling = api._sampling(body, max_tokens_limit, field, max_tokens_limit)
    if sampling["max_tokens"] == 0:
        raise ApiError(f"{field}=0 asks for nothing: give {field} >= 1", field)
    try:
        prompt = template.render(messages)
    except Exception as e:  # noqa: BLE001 - jinja's errors, and what templates raise
        raise ApiError(f"the chat template failed on these messages: {e}", "messages") from e
    sampling["stop"] = sampling["stop"] + template.stops
    request = api.CompletionRequest(prompts=[prompt], **sampling)
    api._check_choices(request)
    return request, messages


def message(cid: str, model: str, choices: list, usage: dict | None,
            created: int | None = None) -> dict:
    """The whole answer: `choices` are (index, text, finish_reason)."""
    out = {"id": cid, "object": "chat.completion", "created": created or int(time.time()),
           "model": model,
           "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                        "logprobs": None, "finish_reason": finish}
                       for i, text, finish in choices]}
    if usage is not None:
        out["usage"] = usage
    return out


def chunk(cid: str, model: str, created: int, choices: list, include_usage: bool) -> dict:
    """One streamed chunk: `choices` are (index, delta, finish_reason). With include_usage
    every chunk has "usage": null but the last, which has no choices and the usage."""
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
                       for i, delta, finish in choices]}
    if include_usage:
        out["usage"] = None
    return out

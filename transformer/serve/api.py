"""OpenAI's completions API, the parts this server speaks: a request's fields checked into a
`CompletionRequest`, and the JSON shapes of answers and errors.

    POST /v1/completions
      model        the served model's id (GET /v1/models); may be left out
      prompt       a string, a list of strings, a list of token ids, or a list of such lists
      max_tokens   new tokens per choice (default 16, or the server's --max_tokens if less;
                   0 with echo scores the prompt only)
      temperature  0 .. 2 (default 1; 0 is greedy)      top_p   (0, 1] (default 1)
      top_k        an extension: keep the k likeliest tokens (default 0: all)
      seed         the same seed, prompt and knobs give the same text as sample.py
                   (default: a fresh random seed per request)
      stop         a string or up to 4: the text ends before the first one
      n            choices per prompt (decoded together, as sample.py --num_samples)
      stream       server-sent events, one per piece of text, `data: [DONE]` at the end
      stream_options  {"include_usage": true}: a last chunk with the usage
      logprobs     0 .. 5: each token's log-probability and the likeliest alternatives
      echo         the prompt comes back in front of the text (with logprobs: scored too)

At most MAX_PROMPTS prompts and MAX_CHOICES choices (prompts x n) in one request.
Anything else OpenAI defines and this server cannot honour (best_of, logit_bias, penalties,
suffix) is refused rather than ignored; unknown fields (e.g. `user`) are ignored.
A refusal is HTTP 400 with {"error": {"message", "type", "param", "code"}}: one line.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
import uuid

from transformer.config import INT32_MAX
from transformer.generate.step import MAX_SEED

MAX_STOPS = 4
MAX_LOGPROBS = 5
MAX_N = 16
# One request's work is bounded: at most MAX_PROMPTS prompts and MAX_CHOICES choices in all
# (prompts x n). A list of 100,000 prompts with n=16 would hold the device for hours.
MAX_PROMPTS = 256
MAX_CHOICES = 256


class ApiError(Exception):
    """A request refused: the HTTP status and OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = (
            " ".join(message.split()), param, status, kind, code)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    prompts: list            # each a str or a list of token ids
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple = ()
    n: int = 1
    stream: bool = False
    logprobs: int | None = None
    echo: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage


def _number(body, name, default, kind, low=None, high=None, low_open=False):
    value = body.get(name)
    if value is None:
        return default
    # Python's JSON reads NaN and Infinity; NaN passes every comparison, so it is refused here.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and math.isnan(value)) or (
            kind is int and isinstance(value, float) and not value.is_integer()):
        raise ApiError(f"{name}={value!r}: must be {'an integer' if kind is int else 'a number'}",
                       name)
    value = kind(value)
    if low is not None and (value <= low if low_open else value < low):
        raise ApiError(f"{name}={value}: must be {'>' if low_open else '>='} {low}", name)
    if high is not None and value > high:
        raise ApiError(f"{name}={value}: must be <= {high}", name)
    return value


def _is_ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                           for t in value)


def _prompts(body) -> list:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError("prompt is missing: give a string, a list of strings or of token ids",
                       "prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif _is_ids(prompt) and prompt:
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (_is_ids(p)) for p in prompt):
        prompts = list(prompt)
    else:
        raise ApiError("prompt: must be a string, a list of strings, a list of token ids or a "
                       "list of such lists (not empty)", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise ApiError(f"prompt: at most {MAX_PROMPTS} prompts in one request, got "
                       f"{len(prompts)}; send the rest in further requests", "prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ApiError(f"prompt {i} is empty: give at least one character or token",
                           "prompt")
        if isinstance(p, str):
            check_unicode(p, f"prompt {i}", "prompt")
    return prompts


def check_unicode(text: str, what: str, param: str) -> None:
    """JSON's "\\ud800" alone parses, but is no Unicode text: the tokenizer's
    UnicodeEncodeError was the 400's message ("'utf-8' codec can't encode character ...",
    at a position in the rendered chat), and a stop string of one never matched."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(f"{what} holds an unpaired surrogate ({text[e.start]!r} at character "
                       f"{e.start}): a \\uD800-\\uDFFF escape must be one of a pair; send "
                       "Unicode text", param) from None


def _stops(body) -> tuple:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError("stop: must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(f"stop: at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    for i, text in enumerate(stops):
        check_unicode(text, f"stop {i}", "stop")
    return tuple(stops)


def _refuse_unsupported(body, names) -> None:
    for name, neutral in names:
        if body.get(name) not in (None, neutral, {}, []) and not (
                name == "best_of" and body.get(name) == body.get("n", 1)):
            raise ApiError(f"{name} is not supported by this server: leave it out", name)


def _flags(body, names) -> None:
    """true or false; null is the default (OpenAI types them "boolean or null")."""
    for name in names:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise ApiError(f"{name}={body[name]!r}: must be true or false", name)


def _include_usage(body) -> bool:
    """stream_options: {"include_usage": true} asks for a last chunk carrying usage (every
    other chunk then has "usage": null). Options this server does not know are refused."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        raise ApiError("stream_options: only allowed with stream=true", "stream_options")
    if not isinstance(options, dict):
        raise ApiError("stream_options: must be an object such as {\"include_usage\": true}",
                       "stream_options")
    unknown = sorted(set(options) - {"include_usage"})
    if unknown:
        raise ApiError(f"stream_options.{unknown[0]} is not supported by this server: only "
                       "include_usage", "stream_options")
    if not isinstance(options.get("include_usage", False), bool):
        raise ApiError("stream_options.include_usage: must be true or false", "stream_options")
    return options.get("include_usage", False)


def _sampling(body, max_tokens_limit, max_tokens_field="max_tokens",
              max_tokens_default=16) -> dict:
    """The fields completions and chat share, checked."""
    seed = body.get("seed")
    return dict(
        # a server started with --max_tokens under 16 caps the default too
        max_tokens=_number(body, max_tokens_field, min(max_tokens_default, max_tokens_limit),
                           int, 0, max_tokens_limit),
        temperature=_number(body, "temperature", 1.0, float, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, float, 0.0, 1.0, low_open=True),
        # top_k past the vocabulary keeps every token; past int32 it cannot reach the device
        top_k=_number(body, "top_k", 0, int, 0, INT32_MAX),
        seed=_number(body, "seed", 0, int, 0, MAX_SEED) if seed is not None
        else secrets.randbelow(MAX_SEED + 1),
        stop=_stops(body),
        n=_number(body, "n", 1, int, 1, MAX_N),
        stream=bool(body.get("stream")),
        include_usage=_include_usage(body))


def _check_choices(request: CompletionRequest) -> None:
    if len(request.prompts) * request.n > MAX_CHOICES:
        raise ApiError(f"{len(request.prompts)} prompts x n={request.n} is "
                       f"{len(request.prompts) * request.n} choices: at most {MAX_CHOICES} in "
                       "one request", "n")


def parse_completion(body, max_tokens_limit: int) -> CompletionRequest:
    """A request body (parsed JSON) checked into a CompletionRequest; raises ApiError."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    _refuse_unsupported(body, (("best_of", None), ("logit_bias", None), ("suffix", None),
                               ("presence_penalty", 0), ("frequency_penalty", 0)))
    _flags(body, ("stream", "echo"))
    request = CompletionRequest(
        prompts=_prompts(body), **_sampling(body, max_tokens_limit),
        logprobs=_number(body, "logprobs", None, int, 0, MAX_LOGPROBS),
        echo=bool(body.get("echo")))
    _check_choices(request)
    if request.max_tokens == 0 and not request.echo:
        raise ApiError("max_tokens=0 asks for nothing: give max_tokens >= 1, or echo=true to "
                       "score the prompt", "max_tokens")
    if request.stream and request.logprobs is not None:
        raise ApiError("logprobs with stream is not supported by this server: ask without "
                       "stream", "logprobs")
    return request


def completion_id(prefix: str = "cmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def choice(index: int, text: str, finish_reason: str | None, logprobs=None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion(cid: str, model: str, choices: list, usage: dict | None = None,
               created: int | None = None) -> dict:
    out = {"id": cid, "object": "text_completion", "created": created or int(time.time()),
           "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_card(model: str, created: int, context_length: int) -> dict:
    """The model object; `context_length` (and vLLM's `max_model_len`) is how many tokens a
    prompt may have: what an evaluation harness's max_length should be."""
    return {"id": model, "object": "model", "created": created, "owned_by": "transformer",
            "context_length": context_length, "max_model_len": context_length}

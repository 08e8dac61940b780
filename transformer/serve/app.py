"""The HTTP routes (Starlette), between the client and the engine's worker thread.

    GET  /                     the page (static/index.html): prompt, knobs, streamed text, attention
    GET  /health               {"status": "ok", "model": ..., "step": ...}
    GET  /v1/models            the one served model, with its context_length
    POST /v1/completions       OpenAI's completions (api.py lists the fields); stream: SSE
    POST /v1/chat/completions  OpenAI's chat completions (chat.py); stream: SSE with deltas
    POST /v1/inspect           an extension for the page: {"text"} -> its tokens; {"text",
                               "query": i} -> token i's attention row in every layer and head
                               and the likeliest tokens after it

Each route is a named handler (`completions`, `chat_completions`, `inspect`, `models`,
`health`, `page`) over one `AppState` (the engine, the model's id, the limits, the admission
count: `app.state.served`), so a route reads, and can be tested, alone; `create_app` only
builds the state. A request's handler checks it (OpenAI's error JSON on anything refused),
queues its work (engine.py), and waits without holding the event loop: reading the JSON,
checking it and tokenizing run on a thread, so a 5 MB prompt delays nobody else. A client
that disconnects cancels its job: a queued one never runs, a running one stops at its next
streamed chunk.

What one client can cost is bounded: a body over `max_body` bytes is refused (413), and at
most `max_queue` requests are in the server at once, queued or running (429 past that).
With `api_key`, every /v1 route wants `Authorization: Bearer <key>` (401). A POST body must
be `application/json` (415): a page on another site can then not post to the server
without a CORS preflight, which this server never grants. Every error, an unexpected one
included, is OpenAI's error JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import threading
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from transformer.serve import api, chat
from transformer.serve.api import ApiError

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = 16 * 2**20   # bytes: a context's worth of token ids is far less
MAX_QUEUE = 64          # requests in the server at once, running or waiting
# json.loads holds the GIL for a whole body (~0.45 s for 5 MB of token ids on a busy 2-vCPU
# machine): bodies above this size are parsed one at a time, so the event loop waits for at
# most one such parse, not for several back to back.
BIG_BODY = 2**20
_BIG_PARSE = threading.Lock()


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _sse(data) -> str:
    return f"data: {json.dumps(data)}\n\n"


class Admission:
    """How many requests are in the server (tokenizing, queued or running); past `limit`, a
    new one is refused with 429 before any work is done for it. A slot is taken when a
    request arrives and handed to its job, which gives it back when it ends (done,
    failed or cancelled), so a slot cannot leak when a stream is dropped before it starts."""

    def __init__(self, limit: int):
        self.limit, self.count, self.lock = limit, 0, threading.Lock()

    def take(self) -> None:
        with self.lock:
            if self.count >= self.limit:
                raise ApiError(f"the server has {self.count} requests in hand (at most "
                               f"{self.limit}): retry shortly", status=429, kind="requests",
                               code="rate_limit_exceeded")
            self.count += 1

    def give_back(self, *_) -> None:
        with self.lock:
            self.count -= 1


def tokenize(engine, prompts, param: str = "prompt", encode=None) -> list[list[int]]:
    """Each prompt's token ids (`encode(text)`: a chat template's encoding of a rendered
    prompt); one longer than the model's context is refused (OpenAI's
    `context_length_exceeded`) rather than cut. Runs off the event loop."""
    S = engine.config.max_seq_len
    out = []
    for i, prompt in enumerate(prompts):
        if encode is None:
            ids = engine.encode(prompt, cut=False)
        else:
            try:
                ids = encode(prompt)
            except ValueError as e:  # the tokenizer's TokenizerError
                raise ApiError(str(e), param) from e
        if len(ids) > S:
            which = f"prompt {i}" if len(prompts) > 1 else "the prompt"
            raise ApiError(f"This model's maximum context length is {S} tokens; {which} has "
                           f"{len(ids)} tokens: shorten it", param,
                           code="context_length_exceeded")
        out.append(ids)
    return out


@dataclasses.dataclass
class AppState:
    """What every route reads: the engine, the served model's id and step, the chat template,
    the API key, the limits, and the admission count (Starlette keeps it as app.state.served)."""

    engine: object
    model: str
    step: int | None
    template: chat.ChatTemplate
    api_key: str | None
    max_body: int
    admission: Admission
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def context(self) -> int:
        return self.engine.config.max_seq_len

    def check_model(self, body) -> None:
        name = body.get("model") if isinstance(body, dict) else None
        if name not in (None, self.model):
            raise ApiError(f"model {name!r} is not served here; this server serves "
                           f"{self.model!r}", "model", status=404, code="model_not_found")

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise ApiError("this server needs an API key: send the header "
                           "'Authorization: Bearer <key>' with the key it was started with"
                           if not given else "the API key given is not this server's",
                           status=401, code="invalid_api_key")

    def too_large(self, size: int) -> ApiError:
        return ApiError(f"the request body is {size} bytes or more: at most {self.max_body}",
                        status=413, code="request_too_large")

    def submit(self, fn):
        """Queues fn(job); the request's admission slot goes with the job."""
        job = self.engine.submit(fn)
        job.future.add_done_callback(self.admission.give_back)
        return job

    def usage(self, prompts_ids, choices) -> dict:
        # n choices of one prompt read it once (as OpenAI counts it); each choice's tokens
        # through the one that ended it (engine._Row.generated), streamed or not
        return api.usage(sum(map(len, prompts_ids)), sum(c.generated for c in choices))


def create_app(engine, model: str, step=None, *, template: chat.ChatTemplate | None = None,
               api_key: str | None = None, max_body: int = MAX_BODY,
               max_queue: int = MAX_QUEUE) -> Starlette:
    """The application serving `engine` under the model id `model`."""
    app = Starlette(routes=ROUTES, exception_handlers={HTTPException: http_error,
                                                       Exception: server_error})
    app.state.served = AppState(engine, model, step, template or chat.ChatTemplate(), api_key,
                                max_body, Admission(max_queue))
    return app


def _served(request: Request) -> AppState:
    return request.app.state.served


# ---------------------------------------------------------------- what the POST routes share

async def read_json(request: Request, parse):
    """The body checked (content type, size, model) and `parse(json)` run off the event loop."""
    served = _served(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(f"the body must be JSON, sent with 'Content-Type: application/json' "
                       f"(got {kind or 'no content type'!r})", status=415,
                       code="unsupported_media_type")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > served.max_body:
        raise served.too_large(int(length))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > served.max_body:
            raise served.too_large(size)
        chunks.append(chunk)

    def work():
        raw = b"".join(chunks)
        try:
            if len(raw) > BIG_BODY:
                with _BIG_PARSE:
                    body = json.loads(raw)
            else:
                body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ApiError("the request body is not valid JSON "
                           f"({' '.join(str(e).split())[:200]})") from e
        served.check_model(body)
        return parse(body)

    return await asyncio.to_thread(work)


async def wait(request: Request, job):
    """The job's result; cancels it if the client disconnects first."""
    future = asyncio.wrap_future(job.future)
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=0.25)
            if done:
                return future.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        job.cancel()  # a no-op once it is done


async def admitted(request: Request, handle):
    """Runs `handle(handed)` holding an admission slot until it hands it to a job (appended
    to `handed`); every error is OpenAI's error JSON."""
    admission = _served(request).admission
    try:
        _served(request).authorize(request)
        admission.take()
    except ApiError as e:
        return _error(e)
    handed = []
    try:
        return await handle(handed)
    except ApiError as e:
        return _error(e)
    except ClientGone:
        return JSONResponse({}, status_code=499)  # nobody reads it
    except Exception as e:  # noqa: BLE001 - OpenAI's error JSON, never a plain-text 500
        return _error(_internal(e))
    finally:
        if not handed:
            admission.give_back()


def streaming(served: AppState, req, prompts_ids, handed, events_of):
    """The job queued now (a 429 or 400 can still be an HTTP status) and its events
    streamed; a client gone before the stream starts still cancels it (background)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def emit(index, piece):  # called on the worker (or XLA's callback) thread
        loop.call_soon_threadsafe(events.put_nowait, (index, piece))

    job = served.submit(lambda job: served.engine.complete(job, req, prompts_ids, emit))
    handed.append(job)
    job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))

    async def body():
        # Events that are ready together go out as one write: the text waiting in the
        # queue, and once the job is done, its last text, finish_reason, usage and
        # [DONE] (each write costs the event loop a trip through Starlette and uvicorn).
        # The bytes, and so every client's events, are the same.
        try:
            ready = []
            async for event in events_of(job, events, prompts_ids):
                ready.append(_sse(event))
                if events.empty() and not job.future.done():
                    yield "".join(ready)
                    ready = []
            ready.append("data: [DONE]\n\n")
            yield "".join(ready)
        finally:
            job.cancel()  # the client left mid-stream (the generator is cancelled): stop

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"},
                             background=BackgroundTask(job.cancel))


async def results(job):
    """The job's choices, or the error event that ends the stream (None)."""
    try:
        if job.future.done() and not job.future.cancelled():  # no hop through the loop
            return job.future.result(), None
        return await asyncio.wrap_future(job.future), None
    except ApiError as e:
        return None, e.body()
    except Exception as e:  # noqa: BLE001 - still OpenAI's error JSON
        return None, _internal(e).body()


# ---------------------------------------------------------------- completions

async def completions(request: Request):
    served = _served(request)
    engine = served.engine

    def parse(body):
        req = api.parse_completion(body, engine.max_tokens)
        prompts_ids = tokenize(engine, req.prompts)
        engine.check_scorable(req, prompts_ids)
        return req, prompts_ids

    async def handle(handed):
        req, prompts_ids = await read_json(request, parse)
        cid = api.completion_id()
        if req.stream:
            return streaming(served, req, prompts_ids, handed,
                             completion_events(served, req, cid))
        job = served.submit(lambda job: engine.complete(job, req, prompts_ids))
        handed.append(job)
        choices = await wait(request, job)
        return JSONResponse(api.completion(
            cid, served.model, [api.choice(c.index, c.text, c.finish_reason, c.logprobs)
                                for c in choices], served.usage(prompts_ids, choices)))
    return await admitted(request, handle)


def completion_events(served: AppState, req, cid):
    async def events_of(job, events, prompts_ids):
        """Each piece of each choice's text as it is made, then one event per choice with
        its finish_reason (then usage, if asked for)."""
        created_at = int(time.time())

        def event(choices, usage=None):
            out = api.completion(cid, served.model, choices, created=created_at)
            if req.include_usage:
                out["usage"] = usage
            return out

        if req.echo:
            for p, prompt in enumerate(req.prompts):
                text = served.engine.prompt_text(prompt)
                for b in range(req.n):
                    yield event([api.choice(p * req.n + b, text, None)])
        while (item := await events.get()) is not None:
            index, piece = item
            yield event([api.choice(index, piece, None)])
        choices, error = await results(job)
        if error is not None:
            yield error
            return
        for c in choices:
            yield event([api.choice(c.index, "", c.finish_reason)])
        if req.include_usage:
            yield event([], served.usage(prompts_ids, choices))
    return events_of


# ---------------------------------------------------------------- chat completions

async def chat_completions(request: Request):
    served = _served(request)
    engine, template = served.engine, served.template

    def parse(body):
        req, _ = chat.parse_chat(body, engine.max_tokens, template)
        return req, tokenize(engine, req.prompts, "messages",
                             lambda text: template.encode(engine.tokenizer, text))

    async def handle(handed):
        req, prompts_ids = await read_json(request, parse)
        cid = api.completion_id("chatcmpl")
        if req.stream:
            return streaming(served, req, prompts_ids, handed, chat_events(served, req, cid))
        job = served.submit(lambda job: engine.complete(job, req, prompts_ids))
        handed.append(job)
        choices = await wait(request, job)
        return JSONResponse(chat.message(
            cid, served.model, [(c.index, c.text, c.finish_reason) for c in choices],
            served.usage(prompts_ids, choices)))
    return await admitted(request, handle)


def chat_events(served: AppState, req, cid):
    async def events_of(job, events, prompts_ids):
        """A role delta per choice, then content deltas as text is made, then each
        choice's finish_reason in an empty delta (then usage, if asked for)."""
        created_at = int(time.time())

        def event(choices):
            return chat.chunk(cid, served.model, created_at, choices, req.include_usage)

        for i in range(len(req.prompts) * req.n):
            yield event([(i, {"role": "assistant", "content": ""}, None)])
        while (item := await events.get()) is not None:
            index, piece = item
            yield event([(index, {"content": piece}, None)])
        choices, error = await results(job)
        if error is not None:
            yield error
            return
        for c in choices:
            yield event([(c.index, {}, c.finish_reason)])
        if req.include_usage:
            yield {**event([]), "usage": served.usage(prompts_ids, choices)}
    return events_of


# ---------------------------------------------------------------- the page's inspection

def parse_inspect(engine, context: int, body):
    """(the text's last `context` token ids, the query index or None), checked."""
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or not text:
        raise ApiError("text: give the text to look inside (a non-empty string)", "text")
    query = body.get("query")
    if query is not None and (isinstance(query, bool) or not isinstance(query, int)
                              or query < 0):
        raise ApiError(f"query={query!r}: must be a token index >= 0", "query")
    # The page looks at the text's last context's worth of tokens.
    ids = engine.encode(text, cut=False)[-context:]
    if not ids:
        raise ApiError("text is empty: give at least one character", "text")
    if query is not None and query >= len(ids):
        raise ApiError(f"query={query}: the text has {len(ids)} tokens", "query")
    return ids, query


async def inspect(request: Request):
    served = _served(request)
    engine = served.engine

    async def handle(handed):
        ids, query = await read_json(
            request, lambda body: parse_inspect(engine, served.context, body))
        if query is None:  # the tokens only: the page lays out the text
            return JSONResponse(engine.inspect_tokens(ids))
        job = served.submit(lambda job: engine.inspect(ids, query))
        handed.append(job)
        return JSONResponse(await wait(request, job))
    return await admitted(request, handle)


# ---------------------------------------------------------------- the GET routes, errors

async def models(request: Request):
    served = _served(request)
    try:
        served.authorize(request)
    except ApiError as e:
        return _error(e)
    return JSONResponse({"object": "list",
                         "data": [api.model_card(served.model, served.created,
                                                 served.context)]})


async def health(request: Request):
    served = _served(request)
    return JSONResponse({"status": "ok", "model": served.model, "step": served.step,
                         "max_tokens": served.engine.max_tokens, "context": served.context,
                         "served": served.engine.stats, "in_hand": served.admission.count,
                         "auth": served.api_key is not None})


async def page(request: Request):
    return FileResponse(STATIC / "index.html")


async def http_error(request: Request, exc: HTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _error(ApiError(f"{request.method} {request.url.path}: {exc.detail}",
                           status=exc.status_code, kind=kind))


async def server_error(request: Request, exc: Exception):
    return _error(_internal(exc))


ROUTES = [Route("/", page), Route("/health", health), Route("/v1/models", models),
          Route("/v1/completions", completions, methods=["POST"]),
          Route("/v1/chat/completions", chat_completions, methods=["POST"]),
          Route("/v1/inspect", inspect, methods=["POST"]),
          Mount("/static", StaticFiles(directory=STATIC), name="static")]


def _internal(e: BaseException) -> ApiError:
    """An error that is not the request's fault, as OpenAI's error JSON (500)."""
    return ApiError(f"internal error: {type(e).__name__}: {e}"[:500], status=500,
                    kind="server_error")

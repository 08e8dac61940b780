"""The HTTP routes (Starlette), between the client and the engine's worker thread.

    GET  /                  the page (static/index.html): prompt, knobs, streamed text, attention
    GET  /health            {"status": "ok", "model": ..., "step": ...}
    GET  /v1/models         the one served model
    POST /v1/completions    OpenAI's completions (api.py lists the fields); stream: SSE
    POST /v1/inspect        an extension for the page: {"text"} -> tokens, attention weights
                            per layer and head, the likeliest next tokens at every position

A request's handler checks it (HTTP 400 with OpenAI's error JSON on a bad field), queues its
work (engine.py), and waits without holding the event loop. A client that disconnects
cancels its job: a queued one never runs, a running one stops at its next streamed chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from transformer.serve import api
from transformer.serve.api import ApiError

STATIC = Path(__file__).resolve().parent / "static"


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _body(request: Request):
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON ({' '.join(str(e).split())})") from e


def _sse(data) -> str:
    return f"data: {json.dumps(data)}\n\n"


def create_app(engine, model: str, step=None) -> Starlette:
    """The application serving `engine` under the model id `model`."""
    created = int(time.time())

    def check_model(body) -> None:
        name = body.get("model") if isinstance(body, dict) else None
        if name not in (None, model):
            raise ApiError(f"model {name!r} is not served here; this server serves {model!r}",
                           "model", status=404, code="model_not_found")

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

    async def completions(request: Request):
        try:
            body = await _body(request)
            check_model(body)
            req = api.parse_completion(body, engine.max_tokens)
            prompts_ids = [engine.encode(p, cut=req.logprobs is None) for p in req.prompts]
            engine.check_scorable(req, prompts_ids)
        except ApiError as e:
            return _error(e)
        cid = api.completion_id()
        if req.stream:
            return StreamingResponse(stream(req, prompts_ids, cid),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        job = engine.submit(lambda job: engine.complete(job, req, prompts_ids))
        try:
            choices = await wait(request, job)
        except ApiError as e:
            return _error(e)
        except ClientGone:
            return JSONResponse({}, status_code=499)  # nobody reads it
        n_prompt = sum(map(len, prompts_ids))
        n_completion = sum(len(c.ids) for c in choices)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                 "total_tokens": n_prompt + n_completion}
        return JSONResponse(api.completion(
            cid, model, [api.choice(c.index, c.text, c.finish_reason, c.logprobs)
                         for c in choices], usage))

    async def stream(req, prompts_ids, cid):
        """Server-sent events: each piece of each choice's text as it is made, then one
        event per choice with its finish_reason, then `data: [DONE]`."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(index, piece):  # called on the worker (or XLA's callback) thread
            loop.call_soon_threadsafe(events.put_nowait, (index, piece))

        job = engine.submit(lambda job: engine.complete(job, req, prompts_ids, emit))
        job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait,
                                                                          None))
        created_at = int(time.time())
        try:
            if req.echo:
                for p, prompt in enumerate(req.prompts):
                    text = engine.prompt_text(prompt)
                    for b in range(req.n):
                        yield _sse(api.completion(cid, model, [
                            api.choice(p * req.n + b, text, None)], created=created_at))
            while (event := await events.get()) is not None:
                index, piece = event
                yield _sse(api.completion(cid, model, [api.choice(index, piece, None)],
                                          created=created_at))
            try:
                choices = job.future.result()
            except ApiError as e:
                yield _sse(e.body())
                return
            for c in choices:
                yield _sse(api.completion(cid, model, [api.choice(c.index, "", c.finish_reason)],
                                          created=created_at))
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # the client left mid-stream (the generator is cancelled): stop

    async def inspect(request: Request):
        try:
            body = await _body(request)
            text = body.get("text") if isinstance(body, dict) else None
            if not isinstance(text, str) or not text:
                raise ApiError("text: give the text to look inside (a non-empty string)",
                               "text")
            job = engine.submit(lambda job: engine.inspect(text))
            return JSONResponse(await wait(request, job))
        except ApiError as e:
            return _error(e)
        except ClientGone:
            return JSONResponse({}, status_code=499)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [api.model_card(model, created)]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": model, "step": step,
                             "max_tokens": engine.max_tokens,
                             "context": engine.config.max_seq_len, "served": engine.stats})

    async def page(request: Request):
        return FileResponse(STATIC / "index.html")

    async def http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(ApiError(f"{request.method} {request.url.path}: {exc.detail}",
                               status=exc.status_code, kind=kind))

    routes = [Route("/", page), Route("/health", health), Route("/v1/models", models),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/inspect", inspect, methods=["POST"]),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

"""The model side of the server: a loaded run, its compiled programs, and one worker thread.

    engine = Engine(model_config, params, tokenizer, max_tokens=256)
    engine.warm_up()                                  compiles what requests will run
    job = engine.submit(lambda job: engine.complete(job, request, prompt_ids, emit))
    job.cancel()                                      the client left: stop at the next chunk

Requests run one at a time, in arrival order, on one worker thread: each is one
`decode.generate` call per prompt, its `n` choices decoded together in one batch, exactly as
`sample.py --num_samples=n` decodes them, so the same prompt, seed and knobs give the same text.
Requests that arrive together wait in the queue rather than share a batch: generate/ draws all
rows of a batch from one key, so batching two requests would change what each one's seed
means (docs/serving.md has the numbers for 1 and 8 concurrent clients).

Compiled once: the generation program's output buffer is fixed at `max_tokens` (the most a
request may ask for), so every max_tokens up to it runs the same program (generate/decode:
`budget`); warm_up compiles it for one row at every prompt bucket, and the scoring pass at
every length bucket. Other batch sizes (n > 1) compile once, on first use.

Generation always streams to the host (every decode.STREAM_EVERY tokens), whether or not the
client does: that is where a cancelled job answers "stop", ending the device loop early.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import queue
import threading
import time

import numpy as np

from transformer.generate import decode, inside
from transformer.generate import text as textgen
from transformer.serve import tokens
from transformer.serve.api import ApiError


class Job:
    """One request's work on the worker thread; its result in `future`."""

    def __init__(self, fn):
        self.fn, self.future = fn, concurrent.futures.Future()
        self.cancelled = threading.Event()
        self.stopped = False  # its work was cut short by the cancel

    def cancel(self) -> None:
        self.cancelled.set()


@dataclasses.dataclass
class Choice:
    index: int
    text: str                 # what the client gets (the prompt first, with echo)
    finish_reason: str        # "stop" (a stop string, or the end-of-text token) or "length"
    ids: list                 # the completion's tokens (within the text)
    logprobs: dict | None = None


class _Row:
    """One choice's text as its tokens come: sample_text's own pieces (a TextStream for whole
    characters, a StopText that cuts at the first stop string and holds back a tail that may
    begin one), ended also by the end-of-text token. `text` is the choice's text so far."""

    def __init__(self, tokenizer, stops):
        self.stream, self.cut = textgen.TextStream(tokenizer), textgen.StopText(stops)
        self.eot = getattr(tokenizer, "eot", None)
        self.ids, self.ended = [], False

    @property
    def stopped(self) -> bool:
        return self.ended or self.cut.stopped

    @property
    def text(self) -> str:
        return self.cut.text[:self.cut.shown]

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        if self.eot is not None and int(token) == self.eot:  # the model ended the document
            piece = self.finish()
            self.ended = True
            return piece
        self.ids.append(int(token))
        return self.cut.push(self.stream.push(token))

    def finish(self) -> str:
        if self.stopped:
            return ""
        return self.cut.push(self.stream.finish()) + self.cut.finish()


class Engine:
    def __init__(self, model_config, params, tokenizer, max_tokens: int = 256, log=print):
        self.config, self.params, self.tokenizer = model_config, params, tokenizer
        self.max_tokens, self.log = max_tokens, log
        self.budget = decode.token_budget(max_tokens)
        self.jobs: queue.Queue = queue.Queue()
        # What /health reports: requests run, the ones stopped or dropped because their
        # client left, and the tokens generated (all choices).
        self.stats = {"jobs": 0, "cancelled": 0, "tokens": 0}
        self.worker = threading.Thread(target=self._work, name="engine", daemon=True)
        self.worker.start()

    # --- the worker ------------------------------------------------------------------------
    def submit(self, fn) -> Job:
        """Queues fn(job) for the worker thread."""
        job = Job(fn)
        self.jobs.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():  # its client left while it waited: no device time
                self.stats["cancelled"] += 1
                job.future.cancel()
                continue
            self.stats["jobs"] += 1
            try:
                job.future.set_result(job.fn(job))
            except BaseException as e:  # noqa: BLE001 - handed to the request's handler
                job.future.set_exception(e)
            if job.stopped:
                self.stats["cancelled"] += 1

    def close(self) -> None:
        self.jobs.put(None)

    # --- requests --------------------------------------------------------------------------
    def encode(self, prompt, cut: bool = True) -> list[int]:
        """A prompt's token ids (a string, or ids already). With `cut`, one longer than the
        context continues from its last max_seq_len tokens, as sample.py does (a prompt to
        score is never cut: check_scorable refuses it). Raises ApiError."""
        if isinstance(prompt, str):
            try:
                if cut:
                    return textgen.encode_prompt(self.tokenizer, prompt,
                                                 self.config.max_seq_len, log=self.log)
                return self.tokenizer.encode(prompt)
            except ValueError as e:  # the tokenizer's TokenizerError
                raise ApiError(str(e), "prompt") from e
        bad = [t for t in prompt if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ApiError(f"prompt holds token id {bad[0]}, outside the vocabulary "
                           f"[0, {self.config.vocab_size})", "prompt")
        return list(prompt)[-self.config.max_seq_len:] if cut else list(prompt)

    def prompt_text(self, prompt) -> str:
        """What echo gives back: the prompt as sent (token ids decoded), however long."""
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(list(prompt))

    def check_scorable(self, request, prompts_ids) -> None:
        """logprobs score the text in one forward pass: it must fit in the context."""
        if request.logprobs is None:
            return
        S = self.config.max_seq_len
        for ids in prompts_ids:
            if len(ids) + request.max_tokens > S:
                raise ApiError(f"logprobs need prompt + max_tokens within the context ({S} "
                               f"tokens); this prompt has {len(ids)} tokens and max_tokens is "
                               f"{request.max_tokens}", "logprobs")

    def complete(self, job: Job, request, prompts_ids, emit=None) -> list[Choice]:
        """Runs on the worker. `emit(index, piece)`: each choice's new text as it comes."""
        emit = emit or (lambda index, piece: None)
        choices = []
        for p, ids in enumerate(prompts_ids):
            rows = [_Row(self.tokenizer, request.stop) for _ in range(request.n)]
            first = p * request.n
            if request.max_tokens > 0 and not job.cancelled.is_set():
                self._generate(job, request, ids, rows, emit, first)
            prompt_text = self.prompt_text(request.prompts[p]) if request.echo else ""
            for b, row in enumerate(rows):
                piece = row.finish()
                if piece:
                    emit(first + b, piece)
                kept = self._ids_within(row)
                logprobs = (self._logprobs(ids, kept, request.logprobs, request.echo)
                            if request.logprobs is not None else None)
                choices.append(Choice(first + b, prompt_text + row.text,
                                      "stop" if row.stopped else "length", kept, logprobs))
        return choices

    def _generate(self, job, request, ids, rows, emit, first) -> None:
        def on_tokens(i, tokens_B, done_B):
            if job.cancelled.is_set():
                job.stopped = True
                return False  # the device loop ends at its next chunk
            self.stats["tokens"] += len(rows)
            for b, row in enumerate(rows):
                piece = row.push(tokens_B[b])
                if piece:
                    emit(first + b, piece)
            if all(row.stopped for row in rows):
                return False
            return True

        try:
            eot = getattr(self.tokenizer, "eot", None)
            decode.generate(self.config, self.params, [ids] * request.n,
                            max_new_tokens=request.max_tokens, seed=request.seed,
                            temperature=request.temperature, top_k=request.top_k,
                            top_p=request.top_p, eos_id=-1 if eot is None else eot,
                            on_tokens=on_tokens, budget=self.budget)
        except decode.GenerationError as e:
            raise ApiError(str(e)) from e

    def _ids_within(self, row: _Row) -> list[int]:
        """The row's tokens whose text lies within its (stop-cut) text."""
        ids = row.ids
        if not row.stopped:
            return ids
        k = len(ids)
        while k > 0 and len(self.tokenizer.decode(ids[:k])) > len(row.text):
            k -= 1
        return ids[:k]

    def _logprobs(self, prompt_ids, ids, top: int, echo: bool) -> dict:
        """OpenAI's logprobs object for the completion (with echo: the prompt's tokens first,
        the very first without a log-probability); tokens named as serve/tokens.py says."""
        text_ids = prompt_ids + ids
        lp = inside.token_logprobs(self.config, self.params, text_ids, top=top)
        return tokens.logprobs(self.names, text_ids, 0 if echo else len(prompt_ids), lp)

    @functools.cached_property
    def names(self) -> tokens.TokenNames:
        return tokens.TokenNames(self.tokenizer)

    def inspect_tokens(self, ids) -> dict:
        """The tokens of a text as the page lays them out (each one's own decoding)."""
        return {"tokens": [self.tokenizer.decode([t]) for t in ids], "ids": list(ids)}

    def inspect(self, ids, query: int, top: int = 8) -> dict:
        """What the page shows for token `query` of a text (at most max_seq_len ids): its row
        of attention weights in every layer and head (weights on tokens 0..query, [L][H][k],
        4 decimals), and the likeliest tokens after it. Only that row travels, not every
        head's T x T weights (~0.9 GB of JSON for GPT-2 small at 1024 tokens). Runs on the
        worker."""
        weights_LHTT, logits_TV = inside.attention(self.config, self.params, list(ids))
        logits_V = logits_TV[query].astype(np.float64)
        probs_V = np.exp(logits_V - logits_V.max())
        probs_V /= probs_V.sum()
        best_K = np.argsort(-probs_V)[:top]
        return {
            "query": query,
            "attention": np.round(weights_LHTT[:, :, query, :query + 1].astype(np.float64),
                                  4).tolist(),
            "next": [{"token": self.tokenizer.decode([int(i)]), "id": int(i),
                      "prob": round(float(probs_V[i]), 5)} for i in best_K]}

    # --- start-up ---------------------------------------------------------------------------
    def warm_up(self) -> float:
        """Compiles, before the first request, the generation program for one row at every
        prompt bucket, and the scoring and attention passes at every length bucket. Returns
        the seconds."""
        begin = time.perf_counter()
        S, P = self.config.max_seq_len, decode.MIN_BUCKET
        lengths = []
        while True:
            lengths.append(min(P, S))
            if P >= S:
                break
            P *= 2
        for length in lengths:
            ids = [0] * length
            decode.generate(self.config, self.params, [ids], max_new_tokens=1,
                            on_tokens=lambda *_: True, budget=self.budget)
            inside.token_logprobs(self.config, self.params, ids, top=inside.MAX_TOP)
            inside.attention(self.config, self.params, ids)
        return time.perf_counter() - begin

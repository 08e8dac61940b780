"""The model side of the server: a loaded run, its compiled programs, and continuous batching.

    engine = Engine(model_config, params, tokenizer, max_tokens=256, max_batch=8)
    engine.warm_up()                                  compiles what requests will run
    job = engine.submit(lambda job: engine.complete(job, request, prompt_ids, emit))
    job.cancel()                                      the client left: stop at the next chunk

Every choice of every request is one row of one running batch (`generate/slots.py`): the
device thread decodes up to `max_batch` rows together, CHUNK = 16 tokens per device call;
between calls, rows that ended (their end-of-text token, a stop string, max_tokens, a client
that left) leave and waiting rows take their slots, in arrival order. A row's prompt is
prefilled when it joins (with the rows joining at the same time whose prompts pad to the same
length), its keys are its own (choice j of seed s draws token i with
fold_in(fold_in(key(s), j), i), as sample.py's sample j), and its slot holds what a decode of
it alone would hold, so each request gets the text it gets alone and that
`sample.py --num_samples=n` gives with the same seed (tests/test_serve_batching.py).

Jobs start in arrival order on one worker thread, each on a job thread of its own (an idle
one reused, `_Threads`): a completion hands its rows to the device thread and lets the next
job start; other work (scoring, the page's inspect) runs on its job's thread. A job
cancelled before any of its rows reached the device never runs (its future is cancelled).

Compiled once, at warm_up: the chunk program and the re-prefill at every row bucket
(generate/slots.py; the re-prefill's program also prefills rows that join together, so it is
compiled at every prompt bucket too), the one-row prefill at every prompt bucket, and the
scoring and attention passes at every length bucket. The KV cache (max_batch rows x the
context) is allocated when the engine is made, so memory does not grow with the load;
nothing compiles per request.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import queue
import threading
import time

import numpy as np

from transformer.generate import inside, slots, step
from transformer.generate import text as textgen
from transformer.serve import tokens
from transformer.serve.api import ApiError


class Job:
    """One request's work; its result in `future`."""

    def __init__(self, fn):
        self.fn, self.future = fn, concurrent.futures.Future()
        self.cancelled = threading.Event()
        self.released = threading.Event()  # the worker may start the next job
        self.stopped = False  # its work was cut short by the cancel
        self.batched = False  # its work is rows on the device thread
        self.on_device = False  # one of its rows reached the device

    def cancel(self) -> None:
        self.cancelled.set()


class _Threads:
    """Daemon threads that each run one call, then wait for the next: a job reuses an idle
    one and a new one starts only when none is idle, so there are at most as many as jobs
    ran at once (a thread started per job cost its start and end, ~40-70 us of CPU)."""

    def __init__(self):
        self.idle: list[queue.SimpleQueue] = []
        self.lock = threading.Lock()

    def run(self, fn, *args) -> None:
        with self.lock:
            inbox = self.idle.pop() if self.idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()
        inbox.put((fn, args))

    def _serve(self, inbox) -> None:
        while True:
            fn, args = inbox.get()
            fn(*args)
            with self.lock:
                self.idle.append(inbox)


class _Cancelled(Exception):
    """A job cancelled before any of its rows reached the device."""


@dataclasses.dataclass
class Choice:
    index: int
    text: str                 # what the client gets (the prompt first, with echo)
    finish_reason: str        # "stop" (a stop string, or the end-of-text token) or "length"
    ids: list                 # the completion's tokens (within the text)
    logprobs: dict | None = None
    generated: int = 0        # what usage.completion_tokens counts (_Row.generated)


class _Row:
    """One choice's text as its tokens come: sample_text's own pieces (a TextStream for whole
    characters, a StopText that cuts at the first stop string and holds back a tail that may
    begin one), ended also by the end-of-text token. `text` is the choice's text so far."""

    def __init__(self, tokenizer, stops, prompt_ids=()):
        # The prompt's ids as the stream's context: a sentencepiece-style decoder spells the
        # space of a first word only after another token (textgen.text_after).
        self.stream = textgen.TextStream(tokenizer, prompt_ids)
        self.cut = textgen.StopText(stops)
        self.ends = textgen.end_ids(tokenizer)  # the end-of-text token, and a folder's others
        self.ids, self.ended = [], False
        self.tokenizer, self.context = tokenizer, list(prompt_ids)[-textgen.TextStream.CONTEXT:]

    @property
    def stopped(self) -> bool:
        return self.ended or self.cut.stopped

    @property
    def text(self) -> str:
        return self.cut.text[:self.cut.shown]

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        if int(token) in self.ends:  # the model ended the document
            piece = self.finish()
            self.ended = True
            return piece
        self.ids.append(int(token))
        return self.cut.push(self.stream.push(token))

    def push_many(self, tokens) -> str:
        """`push` of each token, joined, with one TextStream and one StopText call for the
        tokens before an end-of-text token (the same text: StopText's shown text and its
        held-back tail do not depend on how the text was cut into pieces). Tokens after a
        stop string's match are kept in `ids` too; `Engine._ids_within` trims them."""
        if self.stopped:
            return ""
        tokens = [int(t) for t in tokens]
        k = next((k for k, t in enumerate(tokens) if t in self.ends), None)
        if k is not None:
            piece = self.push_many(tokens[:k]) if k else ""
            return piece + self.push(tokens[k])
        self.ids.extend(tokens)
        return self.cut.push(self.stream.push_many(tokens))

    def finish(self) -> str:
        if self.stopped:
            return ""
        return self.cut.push(self.stream.finish()) + self.cut.finish()

    def generated(self) -> int:
        """The tokens the model generated for this choice, as usage.completion_tokens counts
        them (vLLM's count, and OpenAI's): every token up to and including the one that ended
        it, so the end-of-text token and a stop string's tokens count, though neither is in
        the text; tokens the device made after that one in the same chunk do not (a server
        that decodes a token at a time never makes them)."""
        if self.ended:
            return len(self.ids) + 1  # the end-of-text token
        if not self.cut.stopped:
            return len(self.ids)
        # The first token whose text completes a stop string: back from the last token made
        # (at most a chunk past it) while the text without it still holds a match.
        k = len(self.ids)
        while k > 1 and self._holds_stop(k - 1):
            k -= 1
        return k

    def _holds_stop(self, k: int) -> bool:
        text = textgen.text_after(self.tokenizer, self.context, self.ids[:k])
        return len(textgen.cut_at_stop(text, self.cut.stops)) < len(text)


@dataclasses.dataclass(eq=False)
class _Seq:
    """One choice on its way through the batch: what to decode and where its text goes."""
    job: Job
    ids: list              # the prompt's token ids
    choice: int            # j: its key is fold_in(fold_in(key(seed), j), i)
    index: int             # the choice's index in the answer
    request: object
    row: _Row
    emit: object
    made: int = 0          # tokens the device made for it
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None  # the device step that failed under it, if one did


class Engine:
    def __init__(self, model_config, params, tokenizer, max_tokens: int = 256,
                 max_batch: int = 8, log=print):
        self.config, self.params, self.tokenizer = model_config, params, tokenizer
        self.max_tokens, self.max_batch, self.log = max_tokens, max_batch, log
        self.eot = getattr(tokenizer, "eot", None)
        self.slots = slots.Slots(model_config, params, max_batch)  # the KV cache, now
        self.jobs: queue.Queue = queue.Queue()
        # What /health reports: requests run, the ones stopped or dropped because their
        # client left, and the tokens generated (all choices).
        self.stats = {"jobs": 0, "cancelled": 0, "tokens": 0, "device_errors": 0}
        self.waiting: collections.deque = collections.deque()  # rows without a slot yet
        self.busy: dict[int, _Seq] = {}  # slot -> its row
        self.wake = threading.Condition()
        self.closed = False
        self.threads = _Threads()  # the jobs' threads
        self.worker = threading.Thread(target=self._work, name="engine", daemon=True)
        self.worker.start()
        self.device = threading.Thread(target=self._decode, name="engine-device", daemon=True)
        self.device.start()

    # --- the worker: starts jobs in order --------------------------------------------------------
    def submit(self, fn) -> Job:
        """Queues fn(job); the worker starts it after the jobs before it."""
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
            self.threads.run(self._run, job)
            job.released.wait()  # a completion releases once its rows are queued

    def _run(self, job: Job) -> None:
        try:
            result = job.fn(job)
            if not job.future.cancelled():
                job.future.set_result(result)
        except _Cancelled:
            self.stats["cancelled"] += 1
            job.future.cancel()
        except BaseException as e:  # noqa: BLE001 - handed to the request's handler
            job.future.set_exception(e)
        finally:
            if not job.batched:
                self.stats["jobs"] += 1
            if job.stopped:
                self.stats["cancelled"] += 1
            job.released.set()

    def close(self) -> None:
        self.jobs.put(None)
        with self.wake:
            self.closed = True
            self.wake.notify_all()

    # --- the device thread: continuous batching ------------------------------------------------
    def _decode(self) -> None:
        while True:
            with self.wake:
                while True:
                    self._drop_cancelled()
                    if self.closed:
                        return
                    if self.busy or (self.waiting and self.slots.free()):
                        break
                    self.wake.wait()
                admit = []
                for b in self.slots.free():
                    if not self.waiting:
                        break
                    admit.append((b, self.waiting.popleft()))
            try:
                self._step(admit)
            except Exception as e:  # noqa: BLE001 - the thread must outlive any one request
                self._fail(admit, e)

    def _step(self, admit) -> None:
        """New rows in, then one chunk of tokens for every live row."""
        if admit:
            self._admit(admit)
        self._release_ended()  # before the chunk: a row may end on its first token
        if self.busy and self.slots.live.any():
            tokens_BK, made_B = self.slots.run_chunk()
            for b, seq in list(self.busy.items()):
                self._deliver(seq, tokens_BK[b, :made_B[b]])
            self._release_ended()

    def _fail(self, admit, error: Exception) -> None:
        """A device step raised: every row it held (admitted now or in a slot) ends with the
        error, which its request answers as a 500; the slots are freed and the cache made anew
        (a failed call may have consumed the donated one); rows still waiting run as usual.
        Without this the thread died, and every request after it waited forever while /health
        still said ok."""
        self.stats["device_errors"] += 1
        self.log(f"serve: a device step failed ({type(error).__name__}: {error}); "
                 "its rows end with an error, the server goes on")
        for seq in {id(s): s for s in [s for _, s in admit] + list(self.busy.values())}.values():
            seq.error = error
            seq.done.set()
        self.slots.reset()
        self.busy.clear()

    def _drop_cancelled(self) -> None:
        """Waiting rows whose client left never reach the device."""
        for seq in [s for s in self.waiting if s.job.cancelled.is_set()]:
            self.waiting.remove(seq)
            seq.done.set()

    def _release_ended(self) -> None:
        """Frees the slots of rows that ended: their end-of-text token or a stop string
        (`row.stopped`), max_tokens, or a client that left."""
        for b, seq in list(self.busy.items()):
            if seq.job.cancelled.is_set():
                seq.job.stopped = True
            if (seq.job.cancelled.is_set() or seq.row.stopped or not self.slots.live[b]
                    or seq.made >= seq.request.max_tokens):
                self.slots.release(b)
                del self.busy[b]
                seq.done.set()

    def _admit(self, admit) -> None:
        """Rows (slot, seq) into their slots, prefilled together where their prompts share a
        length bucket (Slots.admit_many), each with its first token."""
        entries = []
        for b, seq in admit:
            r = seq.request
            if not seq.job.on_device:
                seq.job.on_device = True
                self.stats["jobs"] += 1
            entries.append((b, seq.ids, dict(
                seed=r.seed, choice=seq.choice, temperature=r.temperature, top_k=r.top_k,
                top_p=r.top_p, limit=r.max_tokens, eos=-1 if self.eot is None else self.eot)))
        for (b, seq), token in zip(admit, self.slots.admit_many(entries)):
            self.busy[b] = seq
            self._deliver(seq, [token])

    def _deliver(self, seq: _Seq, tokens) -> None:
        """A chunk's tokens into the row's text; its new text goes out as one piece (one
        server-sent event per chunk rather than per token: with many clients, the per-event
        work on the host, not the device, was what limited tokens/s)."""
        seq.made += len(tokens)
        self.stats["tokens"] += len(tokens)
        piece = seq.row.push_many(tokens)
        if piece:
            seq.emit(seq.index, piece)

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
        # The tokens are the tokenizer's: a padded vocabulary's ids past them (vocab_used, a
        # folder's embedding rounded up) are rows that no text ever trained.
        V = min(self.config.vocab_used or self.config.vocab_size,
                getattr(self.tokenizer, "vocab_size", self.config.vocab_size))
        bad = [t for t in prompt if not 0 <= t < V]
        if bad:
            raise ApiError(f"prompt holds token id {bad[0]}, outside the vocabulary "
                           f"[0, {V})", "prompt")
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
        """Runs on the job's thread: hands every choice to the device thread as a row, lets the
        next job start, and waits for them. `emit(index, piece)`: each choice's new text as it
        comes (called on the device thread)."""
        emit = emit or (lambda index, piece: None)
        seqs = [_Seq(job, ids, j, p * request.n + j, request,
                     _Row(self.tokenizer, request.stop, ids), emit)
                for p, ids in enumerate(prompts_ids) for j in range(request.n)]
        job.batched = request.max_tokens > 0  # scoring alone (echo) runs on this thread
        if job.batched:
            with self.wake:
                self.waiting.extend(seqs)
                self.wake.notify_all()
            job.released.set()
            for seq in seqs:
                seq.done.wait()
            failed = next((seq.error for seq in seqs if seq.error is not None), None)
            if failed is not None:
                raise RuntimeError(f"the device step running this request failed: "
                                   f"{type(failed).__name__}: {failed}") from failed
            if job.cancelled.is_set() and not job.on_device:
                raise _Cancelled  # its client left before any of its rows ran
        job.released.set()
        choices = []
        for seq in seqs:
            p = seq.index // request.n
            row = seq.row
            piece = row.finish()
            if piece:
                emit(seq.index, piece)
            kept = self._ids_within(row)
            logprobs = (self._logprobs(prompts_ids[p], kept, request.logprobs, request.echo)
                        if request.logprobs is not None else None)
            prompt_text = self.prompt_text(request.prompts[p]) if request.echo else ""
            choices.append(Choice(seq.index, prompt_text + row.text,
                                  "stop" if row.stopped else "length", kept, logprobs,
                                  row.generated()))
        return choices

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
        # With echo the text is the prompt's text and then the completion's, each decoded on
        # its own (prompt_text, _Row): a prompt of ids that ends inside a character ends with
        # its U+FFFD, and the completion's offsets count it.
        return tokens.logprobs(self.names, text_ids, 0 if echo else len(prompt_ids), lp,
                               len(prompt_ids))

    @functools.cached_property
    def names(self) -> tokens.TokenNames:
        return tokens.TokenNames(self.tokenizer)

    def inspect_tokens(self, ids) -> dict:
        """The tokens of a text as the page lays them out: each one's share of the text
        (tokens.TokenNames.pieces; decoded alone, every byte of a 2-4 byte character was a
        U+FFFD), so that they join into the text."""
        return {"tokens": self.names.pieces(ids), "ids": list(ids)}

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
            "next": [{"token": self.names(int(i)), "id": int(i),  # as logprobs name it
                      "prob": round(float(probs_V[i]), 5)} for i in best_K]}

    # --- start-up ---------------------------------------------------------------------------
    def warm_up(self) -> float:
        """Compiles, before the first request, the chunk at every row bucket and the prefill at
        every prompt bucket (generate/slots.py), and the scoring and attention passes at every
        length bucket. Returns the seconds."""
        begin = time.perf_counter()
        self.slots.warm_up()
        S, P = self.config.max_seq_len, step.MIN_BUCKET
        while True:
            ids = [0] * min(P, S)
            inside.token_logprobs(self.config, self.params, ids, top=inside.MAX_TOP)
            inside.attention(self.config, self.params, ids)
            if P >= S:
                break
            P *= 2
        return time.perf_counter() - begin

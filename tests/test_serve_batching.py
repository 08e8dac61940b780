"""Continuous batching (generate/slots.py, serve/engine.py): every row of a running batch gets
the text it gets alone.

- Slots against decode.generate alone, token for token: rows of different prompt lengths,
  seeds, choices and knobs joining and leaving a 3-slot batch, past the context, for both
  window policies; a planted bug (a row's slot index shared, keys not per choice) fails it.
- The server with --max_batch=4 against 8 concurrent official-`openai`-client requests of
  different lengths, seeds and knobs (greedy and sampled, streamed and not, n > 1, stop
  strings): each gets what it gets alone and what sample.py's sample_text gives.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import serve_run
from transformer.config import ModelConfig
from transformer.generate import decode, slots as slots_lib, step as step_lib
from transformer.model.gpt import init_params

VARIANTS = {
    "reprefill": dict(),                                        # learned positions
    "roll": dict(position="rope", sliding_window=12),           # a ring cache
}
# The ring cache's rows with -m slow (~18 s of CPU for both tests that take VARIANTS; the
# ring's decoding past the context is test_window's and test_decode's in the default run).
BY_POLICY = ["reprefill", pytest.param("roll", marks=pytest.mark.slow)]
# (prompt length, seed, choice, temperature, top_k, top_p, max tokens): more texts than slots,
# so rows join a running batch at other slots and other steps than their neighbours.
ROWS = [(30, 0, 0, 0.0, 0, 1.0, 50), (9, 1, 0, 1.0, 10, 0.9, 70), (9, 1, 1, 1.0, 10, 0.9, 70),
        (3, 2, 2, 0.8, 0, 1.0, 20), (40, 3, 0, 1.0, 5, 1.0, 75), (17, 4, 0, 0.0, 0, 1.0, 33),
        (1, 5, 0, 1.3, 0, 0.5, 5)]


def _config(variant) -> ModelConfig:
    return ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                       max_seq_len=32, matmul="plain", **VARIANTS[variant])


def batched(config, params, rows, max_batch=3, chunk=8, slots=None,
            together=False) -> list[list[int]]:
    """Every row through a Slots batch: admitted when a slot is free, released when done.
    With `together`, the rows that find a free slot at the same chunk are admitted in one
    `admit_many` (as the server admits them)."""
    slots = slots or slots_lib.Slots(config, params, max_batch=max_batch, chunk=chunk)
    out, waiting, where = [[] for _ in rows], list(range(len(rows))), {}
    while waiting or where:
        entries = []
        for b in slots.free():
            if not waiting:
                break
            r = waiting.pop(0)
            prompt, seed, choice, t, k, p, limit = rows[r]
            entries.append((b, prompt, dict(seed=seed, choice=choice, temperature=t, top_k=k,
                                            top_p=p, limit=limit)))
            where[b] = r
        if together:
            tokens = slots.admit_many(entries)
        else:
            tokens = [slots.admit(b, prompt, **knobs) for b, prompt, knobs in entries]
        for (b, _, _), token in zip(entries, tokens):
            out[where[b]].append(token)
        tokens_BK, made_B = slots.run_chunk()
        for b, r in list(where.items()):
            out[r] += tokens_BK[b, :made_B[b]].tolist()
            if not slots.live[b]:
                slots.release(b)
                del where[b]
    return out


def _rows():
    rng = np.random.default_rng(0)
    return [(rng.integers(1, 64, n).tolist(), *rest) for n, *rest in ROWS]


def alone(config, params, rows) -> list[list[int]]:
    """Each row's text alone, as sample.py decodes it: choice j is row j of a batch of j + 1
    copies (--num_samples). Each is decoded to the longest row's length and cut to its own:
    the first tokens do not depend on how many are asked for (test_decode), and one length
    for all rows compiles one program per prompt length and batch, not one per row."""
    longest = max(limit for *_, limit in rows)
    return [decode.generate(config, params, [prompt] * (choice + 1), max_new_tokens=longest,
                            seed=seed, temperature=t, top_k=k, top_p=p)[choice][:limit]
            for prompt, seed, choice, t, k, p, limit in rows]


@functools.cache
def _rows_alone(variant) -> list[list[int]]:
    """`alone` for `_rows()` on the variant's model, once per module run (two tests use it)."""
    config = _config(variant)
    return alone(config, init_params(config, jax.random.key(1)), _rows())


@pytest.mark.parametrize("variant", BY_POLICY)
def test_each_row_of_a_continuous_batch_equals_its_text_alone(variant):
    config = _config(variant)
    assert decode.window_policy(config) == variant
    params = init_params(config, jax.random.key(1))
    rows = _rows()
    got = batched(config, params, rows)
    assert got == _rows_alone(variant)
    assert [len(tokens) for tokens in got] == [limit for *_, limit in rows]
    assert max(len(p) + n for p, *_, n in rows) > 2 * config.max_seq_len  # past the context


def test_a_rows_tokens_are_the_same_in_every_row_bucket(monkeypatch):
    """With 8 slots the 7 texts run in chunks of 1, 4 and 8 rows as they come and go
    (idle rows padding the bucket); each text is still its text alone, token for token, as
    with 3 slots; and once warmed up, nothing compiles however the batch grows and shrinks."""
    from tests.test_decode import CompileCounter

    config = _config("reprefill")
    params = init_params(config, jax.random.key(1))
    rows = _rows()
    slots = slots_lib.Slots(config, params, max_batch=8, chunk=8)
    assert slots.row_buckets == [1, 2, 4, 8]
    slots.warm_up()
    used, original = [], slots._run_rows
    monkeypatch.setattr(slots, "_run_rows", lambda r: used.append(len(r)) or original(r))
    counter = CompileCounter()
    try:
        # one at a time (bucket 1), then all together: 7 rows in bucket 8, then 4, then 1
        alone = [batched(config, params, [row], slots=slots)[0] for row in rows]
        together = batched(config, params, rows, slots=slots)
    finally:
        counter.close()
    assert counter.count == 0
    assert {1, 4, 8} <= set(used)  # 2 too, when exactly two rows are left
    assert together == alone == batched(config, params, rows)


def test_rows_that_fill_together_are_re_prefilled_in_one_call_with_their_tokens_alone(
        monkeypatch):
    """Texts of the same prompt length admitted together fill their cache at the same chunk:
    their re-prefills run as one call of a row bucket (3 rows in bucket 4, the padding a
    repeated row), and each text is still its text alone, token for token, with nothing
    compiled after warm-up."""
    from tests.test_decode import CompileCounter

    config = _config("reprefill")
    params = init_params(config, jax.random.key(1))
    rng = np.random.default_rng(1)
    rows = [(rng.integers(1, 64, 5).tolist(), seed, choice, t, k, p, 90)
            for seed, choice, t, k, p in [(0, 0, 0.0, 0, 1.0), (1, 1, 1.0, 0, 0.9),
                                          (2, 0, 0.8, 6, 1.0)]]
    slots = slots_lib.Slots(config, params, max_batch=4, chunk=8)
    slots.warm_up()
    calls, original = [], slots._run_reprefill
    monkeypatch.setattr(slots, "_run_reprefill",
                        lambda need, tokens, last: calls.append(len(need)) or original(
                            need, tokens, last))
    counter = CompileCounter()
    try:
        got = batched(config, params, rows, slots=slots)
    finally:
        counter.close()
    assert counter.count == 0
    assert 3 in calls  # all three in one call, more than once (90 tokens, a 32-slot context)
    assert got == alone(config, params, rows)


def test_a_planted_bug_breaks_the_equality(monkeypatch):
    """The check can fail: keys drawn for choice 0 whatever the choice, or one slot index
    for every row (the first row's), each change some row's text."""
    config = _config("reprefill")
    params = init_params(config, jax.random.key(1))
    rows = _rows()
    good = batched(config, params, rows)
    # Slots of one config share their programs (slots._programs), traced before the plant:
    # each planted Slots traces its own, and the shared ones stay unplanted.
    uncached = slots_lib._programs.__wrapped__
    original = slots_lib._row_key
    monkeypatch.setattr(slots_lib, "_programs", uncached)
    monkeypatch.setattr(slots_lib, "_row_key", lambda seed, choice, i: original(seed, 0, i))
    assert batched(config, params, rows) != good
    monkeypatch.undo()
    monkeypatch.setattr(slots_lib, "_programs", uncached)
    original_forward = step_lib.forward  # the decode core's, which slots' chunk calls
    monkeypatch.setattr(step_lib, "forward", lambda c, p, t, cache, index, start_B: (
        original_forward(c, p, t, cache, index if jnp.ndim(index) == 0
                         else index * 0 + index[0], start_B)))
    assert batched(config, params, rows) != good


# --- the server ---------------------------------------------------------------------------

openai = pytest.importorskip("openai")
MAX_BATCH = 4


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return serve_run.char_run(tmp_path_factory)


@pytest.fixture(scope="module")
def server(workdir):
    with serve_run.server(workdir, f"--max_batch={MAX_BATCH}", max_tokens=200) as (base, _):
        yield base


# 8 requests, 11 rows for 4 slots: different prompts (the longest 28 of the 32-token context:
# a longer one is refused with context_length_exceeded), lengths (past the context), seeds,
# knobs, n, stop strings, streamed or not.
REQUESTS = [
    dict(prompt="the quick ", max_tokens=60, temperature=0.0, seed=0, stream=False),
    dict(prompt="a lazy ", max_tokens=150, temperature=1.0, top_p=0.9, seed=3, n=3,
         stream=True),
    dict(prompt="the ", max_tokens=25, temperature=0.8, seed=11, stop=["e t", "og"],
         stream=False),
    dict(prompt="over the lazy dog the quick ", max_tokens=90, temperature=1.0,
         seed=5, top_k=8, stream=True),
    dict(prompt="q", max_tokens=7, temperature=1.2, seed=2, stream=False),
    dict(prompt="brown ", max_tokens=120, temperature=0.0, seed=9, stop="zz", stream=True),
    dict(prompt="jumps ", max_tokens=40, temperature=0.7, seed=4, n=2, top_p=0.8,
         stream=False),
    dict(prompt="the lazy ", max_tokens=33, temperature=1.0, seed=8, stop=" ", stream=True),
]


def ask(client, request) -> list[str]:
    """The request's choices' texts, through the official client (streamed or not)."""
    body = dict(request)
    extra = {"top_k": body.pop("top_k")} if "top_k" in body else None
    stream = body.pop("stream")
    reply = client.completions.create(model="tiny", stream=stream, extra_body=extra, **body)
    if not stream:
        return [c.text for c in sorted(reply.choices, key=lambda c: c.index)]
    texts = {}
    for chunk in reply:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    return [texts.get(i, "") for i in range(request.get("n", 1))]


@pytest.mark.slow  # in process: the Slots tests above; test_serve's concurrent clients
def test_eight_concurrent_clients_each_get_their_text_alone_and_sample_pys(workdir, server):
    from transformer.checkpoint import load_run
    from transformer.generate import text as textgen

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    run_ = load_run(workdir)
    expected = [textgen.sample_text(
        run_.model_config, run_.params, run_.tokenizer, r["prompt"], num_samples=r.get("n", 1),
        max_new_tokens=r["max_tokens"], temperature=r["temperature"], top_k=r.get("top_k", 0),
        top_p=r.get("top_p", 1.0), seed=r["seed"], stop=r.get("stop")) for r in REQUESTS]
    alone = [ask(client, r) for r in REQUESTS]
    assert alone == expected
    together = [None] * len(REQUESTS)

    def one(i):
        together[i] = ask(client, REQUESTS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert together == expected
    assert len({text for texts in expected for text in texts}) > 8  # not all alike
    assert any(len(t) < r["max_tokens"] for r, ts in zip(REQUESTS, expected) for t in ts
               if "stop" in r)  # a stop string cut some text



@pytest.mark.parametrize("filters", [True, False], ids=["filtered", "temperature-only"])
def test_sample_rows_gives_each_row_its_token_alone(filters):
    """One batched draw with per-row knobs and keys equals each row drawn alone by
    `sampling.sample` (decode's path), greedy rows included; without any top-k / top-p the
    sort is skipped and the draw is still the same."""
    from transformer.generate import sampling

    B, V = 6, 50
    logits_BV = jax.random.normal(jax.random.key(3), (B, V)) * 3
    temperature = np.array([0.0, 1.0, 0.7, 1.3, 0.0, 1.0], np.float32)
    top_k = np.array([0, 5, 0, 0, 3, 40] if filters else [0] * B, np.int32)
    top_p = np.array([1.0, 1.0, 0.8, 0.5, 1.0, 0.9] if filters else [1.0] * B, np.float32)
    for seed in range(5):
        keys_B2 = jnp.stack([slots_lib._row_key(seed, b, 0) for b in range(B)])
        together = jax.jit(sampling.sample_rows)(logits_BV, keys_B2, temperature, top_k, top_p)
        alone = [int(sampling.sample(logits_BV[b:b + 1], keys_B2[b:b + 1], temperature[b],
                                     top_k[b], top_p[b])[0]) for b in range(B)]
        assert np.asarray(together).tolist() == alone


@pytest.mark.parametrize("variant", BY_POLICY)
def test_rows_admitted_together_are_prefilled_in_one_call_with_their_tokens_alone(
        variant, monkeypatch):
    """Rows that join at the same chunk with prompts of one length bucket are prefilled in
    one call (`admit_many`: the re-prefill's program at that length), and each text is still
    its text alone, token for token; nothing compiles after warm-up."""
    from tests.test_decode import CompileCounter

    config = _config(variant)
    params = init_params(config, jax.random.key(1))
    rows = _rows()
    slots = slots_lib.Slots(config, params, max_batch=4, chunk=8)
    slots.warm_up()
    prefills, admitting = [], []
    original_admit, original_call = slots.admit_many, slots._run_reprefill
    monkeypatch.setattr(slots, "admit_many", lambda entries: admitting.append(1) or (
        original_admit(entries), admitting.pop())[0])
    monkeypatch.setattr(slots, "_run_reprefill", lambda need, tokens, last: (
        admitting and prefills.append(len(need))) or original_call(need, tokens, last))
    counter = CompileCounter()
    try:
        got = batched(config, params, rows, slots=slots, together=True)
    finally:
        counter.close()
    assert counter.count == 0
    assert max(prefills) > 1  # several rows prefilled in one call
    assert got == _rows_alone(variant)


def test_a_failing_device_step_fails_its_requests_and_the_engine_goes_on(monkeypatch):
    """A device step that raises (a planted failure of one chunk) ends the requests it was
    running with that error, and the next request gets the text it got before: the device
    thread used to die there, and every later request waited forever."""
    from transformer.data.tokenizers import ByteTokenizer
    from transformer.serve import api
    from transformer.serve.engine import Engine

    config = _config("reprefill")
    engine = Engine(config, init_params(config, jax.random.key(1)), ByteTokenizer(),
                    max_tokens=32, max_batch=2, log=lambda line: None)
    prompt = [5, 6, 7]
    request = api.parse_completion({"prompt": [prompt], "max_tokens": 12, "temperature": 0,
                                    "n": 2, "seed": 0}, 32)

    def ask():
        job = engine.submit(lambda job: engine.complete(job, request, [prompt]))
        return [c.text for c in job.future.result(timeout=120)]

    before = ask()
    real, planted = engine.slots.run_chunk, []

    def fails_once():
        if not planted:
            planted.append(True)
            raise RuntimeError("planted device failure")
        return real()

    monkeypatch.setattr(engine.slots, "run_chunk", fails_once)
    with pytest.raises(RuntimeError, match="planted device failure"):
        ask()
    assert engine.stats["device_errors"] == 1
    assert ask() == before
    assert engine.device.is_alive()
    engine.close()


def test_jobs_reuse_idle_threads_and_run_at_once_when_none_is_idle():
    """A job runs on an idle job thread if there is one (starting and ending a thread per
    job cost ~40-70 us of CPU each): 20 jobs one after the other use one thread; 3 that
    block together get 3, and each runs."""
    from transformer.serve.engine import _Threads

    threads, seen = _Threads(), []
    for _ in range(20):
        done = threading.Event()
        threads.run(lambda done=done: (seen.append(threading.get_ident()), done.set()))
        assert done.wait(10)
        while not threads.idle:  # the thread is idle again once its call returned
            threading.Event().wait(0.001)
    assert len(seen) == 20 and len(set(seen)) == 1
    gate, started = threading.Barrier(4), []
    for _ in range(3):
        threads.run(lambda: (started.append(threading.get_ident()), gate.wait(10)))
    gate.wait(10)  # all three ran at once: none waited for another's thread
    assert len(set(started)) == 3

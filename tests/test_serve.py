"""The server (transformer/serve/) against the official `openai` client, over one tiny trained
run and one real server process on a free 127.0.0.1 port, shared by the module:

- text, streamed and not, equals sample.py's for the same prompt, seed and knobs (greedy and
  sampled, several choices decoded together);
- logprobs and echo are the model's own log-softmax (GPT.apply here, in the test);
- bad requests get HTTP 400 with OpenAI's error JSON, one line;
- concurrent clients each get the text they would get alone;
- a client that leaves mid-stream stops its generation early.
"""

from __future__ import annotations

import threading
import time

import httpx
import jax
import numpy as np
import pytest

from tests import serve_run
from tests.conftest import ROOT
from tests.test_resume import run

openai = pytest.importorskip("openai")

MAX_TOKENS = 512  # the server's limit (its compiled output buffer)
PROMPT = "the quick "


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return serve_run.char_run(tmp_path_factory)


SERVER_PID = {}  # base URL -> the server process's pid (the measure test reads its CPU)


@pytest.fixture(scope="module")
def server(workdir):
    with serve_run.server(workdir, max_tokens=MAX_TOKENS) as (base, proc):
        SERVER_PID[base] = proc.pid
        yield base


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


def sample_py(workdir, prompt, n, max_tokens, temperature, top_k, top_p, seed) -> list[str]:
    out = run(["sample.py", f"--workdir={workdir}", f"--prompt={prompt}",
               f"--max_new_tokens={max_tokens}", f"--temperature={temperature}",
               f"--top_k={top_k}", f"--top_p={top_p}", f"--seed={seed}", f"--num_samples={n}",
               "--no_stream"])
    assert out.returncode == 0, out.stderr
    texts = out.stdout.split("--- sample ")[1:]
    return [t.split(" ---\n", 1)[1][len(prompt):].removesuffix("\n") for t in texts]


def streamed(client, **kwargs) -> tuple[dict, dict]:
    """({choice index: text}, {choice index: finish_reason}) of a streamed completion."""
    texts, finish = {}, {}
    for chunk in client.completions.create(model="tiny", stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish


@pytest.mark.parametrize("knobs", [
    dict(n=1, temperature=0.0, top_k=0, top_p=1.0, seed=0),          # greedy
    # sampled, one batch; a seed whose 3 texts all run to max_tokens (seed 7's made the
    # end-of-text token once the row noise became threefry's, docs/sampling.md)
    dict(n=3, temperature=1.0, top_k=10, top_p=0.95, seed=1),
], ids=["greedy", "sampled"])
def test_text_equals_sample_py_streamed_and_not(workdir, client, knobs):
    max_tokens = 40
    expected = sample_py(workdir, PROMPT, max_tokens=max_tokens, **knobs)
    extra = {"top_k": knobs["top_k"]}
    args = dict(prompt=PROMPT, max_tokens=max_tokens, n=knobs["n"],
                temperature=knobs["temperature"], top_p=knobs["top_p"], seed=knobs["seed"])
    reply = client.completions.create(model="tiny", extra_body=extra, **args)
    assert [c.text for c in sorted(reply.choices, key=lambda c: c.index)] == expected
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage.completion_tokens == knobs["n"] * max_tokens
    texts, finish = streamed(client, extra_body=extra, **args)
    assert [texts[i] for i in range(knobs["n"])] == expected
    assert set(finish.values()) == {"length"}
    if knobs["n"] > 1:
        assert len(set(expected)) > 1  # the choices are samples, not copies


def test_stream_ends_with_done_and_stop_cuts_the_text(server, client):
    with httpx.stream("POST", f"{server}/v1/completions", json=dict(
            prompt=PROMPT, max_tokens=30, temperature=0, stream=True), timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30,
                                     temperature=0).choices[0].text
    stop = full[5:7]  # two characters the text holds
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0,
                                    stop=[stop, "@@"])
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # usage counts the stop string's tokens (one a character), streamed or not
    assert cut.usage.completion_tokens == full.index(stop) + len(stop)
    texts, finish = streamed(client, prompt=PROMPT, max_tokens=30, temperature=0, stop=stop)
    assert texts[0] == full[:full.index(stop)] and finish[0] == "stop"
    *_, last = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30,
                                         temperature=0, stop=stop, stream=True,
                                         stream_options={"include_usage": True})
    assert last.usage == cut.usage


def test_a_stream_sends_its_first_token_alone_then_a_chunk_per_event(server, client):
    """Server-sent events cost the host per event, for the server and the client alike, so a
    stream sends a device chunk's new text as one event (vLLM's stream interval), except the
    first token, which goes out alone as soon as it exists (time to first token). Joined, the
    events are the unstreamed text. (Chat's deltas come from the same pieces.)"""
    import json
    import math

    from transformer.generate import slots

    n = 40
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=n,
                                     temperature=0).choices[0].text
    assert full  # one token a character
    with httpx.stream("POST", f"{server}/v1/completions", json=dict(
            prompt=PROMPT, max_tokens=n, temperature=0, stream=True), timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts = [c["text"] for e in events for c in e["choices"] if c["text"]]
    assert "".join(texts) == full
    assert texts[0] == full[:1]  # the first token on its own
    assert len(texts) <= 1 + math.ceil((n - 1) / slots.CHUNK)  # then a chunk an event


def test_a_streams_last_text_finish_reason_and_done_go_out_in_one_write():
    """Events ready together are one write (each costs the event loop a trip through
    Starlette and uvicorn): once the job is done, its last text, its finish_reason and
    [DONE]. The bytes are the events one by one, joined. In process, with an engine that
    makes two pieces of text."""
    import json

    from starlette.testclient import TestClient

    from transformer.serve.app import create_app
    from transformer.serve.engine import Choice

    class TwoPieces:
        class config:
            max_seq_len, vocab_size = 64, 256

        max_tokens, stats = 16, {}

        def encode(self, prompt, cut=True):
            return [1, 2, 3]

        def check_scorable(self, request, ids):
            pass

        def complete(self, job, request, prompts_ids, emit):
            emit(0, "ab")
            emit(0, "cd")
            return [Choice(0, "abcd", "stop", [4, 5, 6, 7], None, 4)]

        def submit(self, fn):
            return serve_run.settled_job(fn)

    app, writes = create_app(TwoPieces(), "m"), []

    async def counted(scope, receive, send):
        async def counting_send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                writes.append(message["body"].decode())
            await send(message)
        await app(scope, receive, counting_send)

    with TestClient(counted) as http:
        r = http.post("/v1/completions", json=dict(prompt="x", stream=True))
    assert r.status_code == 200 and "".join(writes) == r.text
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    texts = [c["text"] for e in events[:-1] for c in json.loads(e)["choices"]]
    assert "".join(texts) == "abcd"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
    assert '"finish_reason": "stop"' in writes[-1] and writes[-1].endswith("data: [DONE]\n\n")
    assert '"cd"' in writes[-1]  # the last text too: the job was done when it was read


def model_logprobs(workdir, ids) -> np.ndarray:
    """log p(ids[t] | ids[:t]) for t >= 1, from the model's own forward pass."""
    from transformer.checkpoint import load_run
    from transformer.model.gpt import GPT

    run_ = load_run(workdir)
    forward = jax.jit(lambda p, x: GPT(run_.model_config).apply({"params": p}, x))  # not op by op
    logits = forward(run_.params, np.asarray([ids], np.int32))
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits[0], np.float32), axis=-1))
    return logp[np.arange(len(ids) - 1), ids[1:]], logp, run_.tokenizer


def test_echo_scores_the_prompt_with_the_models_log_softmax(workdir, client):
    text = "the lazy dog jumps over"
    reply = client.completions.create(model="tiny", prompt=text, max_tokens=0, echo=True,
                                      logprobs=2)
    [c] = reply.choices
    assert c.text == text
    expected, logp, tokenizer = model_logprobs(workdir, tokenizer_ids(workdir, text))
    lp = c.logprobs
    assert "".join(lp.tokens) == text and lp.token_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:], expected, atol=2e-4)
    assert lp.text_offset == list(range(len(text)))  # a char model: token t is character t
    for t, top in enumerate(lp.top_logprobs[1:]):  # the two likeliest after tokens[:t+1]
        best = np.argsort(-logp[t])[:2]
        assert list(top.values())[:2] == pytest.approx(logp[t][best].tolist(), abs=2e-4)
        assert list(top)[:2] == [tokenizer.decode([int(i)]) for i in best]
        assert len(top) == 2 + (lp.tokens[t + 1] not in list(top)[:2])  # then the token


def test_top_logprobs_always_hold_the_token_itself(client):
    """OpenAI: "The API will always return the logprob of the sampled token, so there may be
    up to logprobs+1 elements" (vLLM too); a sampled token outside the likeliest k was
    missing, so top_logprobs[i][tokens[i]] raised KeyError (logprobs=0 gave {} everywhere)."""
    for k, echo in ((0, False), (1, False), (1, True)):
        [c] = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, echo=echo,
                                        temperature=2.0, seed=5, logprobs=k).choices
        lp = c.logprobs
        first = 1 if echo else 0  # the text's first token has no log-probability
        for token, value, top in list(zip(lp.tokens, lp.token_logprobs,
                                          lp.top_logprobs))[first:]:
            assert top[token] == pytest.approx(value, abs=1e-6)
            assert k <= len(top) <= k + 1


def test_logprobs_of_generated_tokens(workdir, client):
    reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                      temperature=1.0, seed=3, logprobs=0)
    [c] = reply.choices
    assert "".join(c.logprobs.tokens) == c.text and len(c.logprobs.tokens) == 12
    ids = tokenizer_ids(workdir, PROMPT + c.text)
    expected, _, _ = model_logprobs(workdir, ids)
    np.testing.assert_allclose(c.logprobs.token_logprobs, expected[-12:], atol=2e-4)



def test_a_prompt_past_the_context_is_refused_not_cut(client):
    """It was cut to its last 32 tokens and answered 200; now it is OpenAI's 400."""
    long = "the lazy dog " * 4  # 52 characters, a char model with a 32-token context
    for prompt in (long, [0] * len(long)):  # as text, and as token ids
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=5, echo=True)
        assert caught.value.body["code"] == "context_length_exceeded"
        assert "32 tokens" in caught.value.body["message"]
    [c] = client.completions.create(model="tiny", prompt=long[:32], max_tokens=5, echo=True,
                                    temperature=0).choices  # 32 tokens: within it
    assert c.text.startswith(long[:32])


def tokenizer_ids(workdir, text):
    from transformer.checkpoint import load_run
    return load_run(workdir).tokenizer.encode(text)


@pytest.mark.parametrize("kwargs, param", [
    (dict(temperature=-1), "temperature"),
    (dict(temperature=3), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(n=0), "n"),
    (dict(max_tokens=MAX_TOKENS + 1), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(logprobs=9), "logprobs"),
    (dict(prompt=""), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[1, 2, 10**6]), "prompt"),
    (dict(prompt="x" * 20, logprobs=1, max_tokens=20), "logprobs"),  # 20 + 20 > 32
    (dict(prompt="the " * 6, logprobs=1, max_tokens=10, echo=True), "logprobs"),  # 24 + 10
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(extra_body={"top_k": -1}), "top_k"),
])
def test_bad_requests_get_400_with_openai_error_json(client, kwargs, param):
    kwargs = {"prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", **kwargs)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] and "\n" not in error["message"]


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_nan_knobs_are_refused(server, field):
    """Python's JSON reads NaN (json.dumps writes it by default); NaN fails no comparison, so
    temperature=NaN and top_p=NaN were sampled with, answering 200."""
    body = f'{{"prompt": "{PROMPT}", "max_tokens": 4, "{field}": NaN}}'.encode()
    r = httpx.post(f"{server}/v1/completions", content=body, timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


@pytest.mark.parametrize("path, body, param, what", [
    ("completions", '"prompt": "ab\\ud800", "max_tokens": 4', "prompt", "prompt 0"),
    ("completions", '"prompt": "ab", "stop": ["x", "\\udfff"], "max_tokens": 4', "stop",
     "stop 1"),
    ("chat/completions", '"messages": [{"role": "user", "content": "ab\\ud800"}]', "messages",
     "messages[0].content"),
])
def test_an_unpaired_surrogate_is_refused_naming_the_field(server, path, body, param, what):
    """JSON's "\\ud800" alone is valid JSON but no Unicode text: a prompt's 400 said
    "'utf-8' codec can't encode character" (for a chat, at a position in the rendered
    template), and a stop string of one was accepted and could never match."""
    r = httpx.post(f"{server}/v1/{path}", content=f"{{{body}}}".encode(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(
        f"{what} holds an unpaired surrogate"), error


@pytest.mark.parametrize("field", ["stream", "echo"])
def test_null_flags_mean_their_default(server, field):
    """OpenAI types stream and echo "boolean or null"; a client that writes out every field
    sends null, which got 400 "must be true or false" (null already meant the default for
    every other field)."""
    r = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, field: None})
    assert r.status_code == 200, r.text
    [c] = r.json()["choices"]
    assert not c["text"].startswith(PROMPT) and r.json()["usage"]["completion_tokens"] == 4


def test_a_top_k_past_int32_is_refused_and_the_server_keeps_answering(client):
    """top_k=10**12 passed the checks, then overflowed the device thread's int32 knobs: the
    thread died, and this and every later request waited forever while /health said ok."""
    quick = client.with_options(timeout=60)
    with pytest.raises(openai.BadRequestError) as caught:
        quick.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                 extra_body={"top_k": 10**12})
    assert caught.value.body["param"] == "top_k"
    [c] = quick.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                   extra_body={"top_k": 10**6}).choices  # past V: all tokens
    assert c.finish_reason in ("length", "stop")


def test_the_default_max_tokens_is_within_the_servers_limit():
    """A server started with --max_tokens=8 gave a completion that named no max_tokens 16
    tokens (OpenAI's default), past the most one choice may have."""
    from transformer.serve import api
    assert api.parse_completion({"prompt": PROMPT}, max_tokens_limit=8).max_tokens == 8
    assert api.parse_completion({"prompt": PROMPT}, max_tokens_limit=512).max_tokens == 16


def test_the_server_takes_exactly_the_seeds_sample_py_takes():
    """One range for both (decode.MAX_SEED): a seed the server took and decode refused failed
    on the device thread; one it refused and sample.py took could not be asked of it."""
    from transformer.generate import decode
    from transformer.serve import api
    top = decode.MAX_SEED
    assert api.parse_completion({"prompt": PROMPT, "seed": top}, 8).seed == top
    for seed in (-1, top + 1):
        with pytest.raises(api.ApiError, match="seed"):
            api.parse_completion({"prompt": PROMPT, "seed": seed}, 8)
    assert 0 <= api.parse_completion({"prompt": PROMPT}, 8).seed <= top  # a fresh one


def test_a_padded_vocabularys_padding_ids_are_not_prompt_tokens():
    """A run with model.vocab_multiple (257 byte tokens padded to 320) took ids 257..319 in a
    prompt: text from embedding rows no text trained, and with logprobs an HTTP 500 (their
    log-probability is -inf, which JSON cannot carry). They are outside the vocabulary."""
    from types import SimpleNamespace

    from transformer.data.tokenizers import ByteTokenizer
    from transformer.serve.api import ApiError
    from transformer.serve.engine import Engine

    engine = SimpleNamespace(  # what Engine.encode reads
        config=SimpleNamespace(vocab_size=320, vocab_used=257, max_seq_len=64),
        tokenizer=ByteTokenizer(eot=True), log=print)
    assert Engine.encode(engine, [104, 256], cut=False) == [104, 256]  # a byte, the end
    for ids in ([104, 300], [257], [319]):
        with pytest.raises(ApiError) as caught:
            Engine.encode(engine, ids, cut=False)
        assert caught.value.param == "prompt" and "[0, 257)" in caught.value.message


def test_a_folders_end_of_sequence_token_ends_a_choice(tmp_path):
    """serve --hf of a folder whose end token is not <|endoftext|> (Llama's and Mistral's
    </s>, Qwen's <|im_end|>): the tokenizer knew no end token, so no choice ever ended at
    it; each ran to max_tokens with text from past the end (finish_reason "length")."""
    import json

    from transformer.data.tokenizers import BPETokenizer
    from transformer.hf import load
    from transformer.serve.engine import _Row
    from transformer.serve.tokens import TokenNames

    hf = BPETokenizer.train("the quick brown fox jumps over the lazy dog\n" * 20,
                            280).hf_tokenizer()
    hf.add_special_tokens(["<s>", "</s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    end = hf.token_to_id("</s>")
    for spec, config in (({"eos_token": "</s>"}, {"eos_token_id": 0}),  # the named token
                         ({"eos_token": {"content": "</s>"}}, {}),
                         ({}, {"eos_token_id": [end, 0]})):  # config.json's, the first
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(spec))
        tokenizer = load.ending_at(load.tokenizer(tmp_path), tmp_path, config)
        assert tokenizer.eot == end
        row = _Row(tokenizer, ())
        text = row.push_many(tokenizer.encode("the fox") + [end] + tokenizer.encode(" dog"))
        assert row.stopped and text + row.finish() == "the fox"
        assert TokenNames(tokenizer)(end) == "</s>"


def test_every_end_token_a_folder_lists_ends_a_choice(tmp_path):
    """Llama 3.1's generation_config.json lists several end tokens (<|end_of_text|>,
    <|eom_id|>, <|eot_id|>) and transformers stops at any: a choice ends at each of them,
    the named eos_token first among them (the device's); only that one ended it before."""
    import json

    from transformer.data.tokenizers import BPETokenizer
    from transformer.hf import load
    from transformer.serve.engine import _Row

    hf = BPETokenizer.train("the quick brown fox jumps over the lazy dog\n" * 20,
                            280).hf_tokenizer()
    hf.add_special_tokens(["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    ends = [hf.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    for config in ({"eos_token_id": ends[0]}, {}):
        tokenizer = load.ending_at(load.tokenizer(tmp_path), tmp_path, config)
        assert tokenizer.eot == ends[2] and set(tokenizer.end_ids) == set(ends)
        for end in ends:
            row = _Row(tokenizer, ())
            text = row.push_many(tokenizer.encode("the fox") + [end] + tokenizer.encode(" dog"))
            assert row.stopped and text + row.finish() == "the fox"
            assert row.generated() == len(tokenizer.encode("the fox")) + 1  # the end counts


def test_completion_tokens_count_through_the_token_that_ended_the_choice():
    """usage.completion_tokens counts what the model generated, as vLLM and OpenAI count it:
    the end-of-text token and a stop string's tokens too (neither is in the text), and
    nothing the device made after the token that ended the choice (a chunk runs on past it).
    It counted only the tokens within the text."""
    from transformer.data.tokenizers import ByteTokenizer, CharTokenizer
    from transformer.serve.engine import _Row

    text = "the quick fox jumps over"
    for tok in (ByteTokenizer(eot=True), CharTokenizer.from_text(text + "é", eot=True)):
        ids = tok.encode(text)
        for stops, through in ((["fox", "zz"], "the quick fox"),
                               (["ump", "fox j"], "the quick fox j"), (["é"], text), ([], text)):
            row = _Row(tok, stops, tok.encode("over "))
            row.push_many(ids[:3])
            row.push_many(ids[3:])  # a chunk that runs past the stop
            assert row.generated() == len(tok.encode(through)), (stops, tok.kind)
        row = _Row(tok, ["zz"])
        row.push_many(ids[:4] + [tok.eot] + ids[4:])
        assert row.text == "the " and row.generated() == 5  # the end token counts


def test_malformed_bodies_and_an_unknown_model(server, client):
    r = httpx.post(f"{server}/v1/completions", content=b"{not json", timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/completions", json=[1, 2], timeout=10)
    assert r.status_code == 400 and r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(f"{server}/health", timeout=10).json()
    assert health["status"] == "ok" and health["step"] == 60


def test_measure_asks_for_what_fits_in_the_context_and_counts_cpu_per_token(server):
    """serve.measure's headline asks for the new tokens that fit after its prompt (the
    context minus the prompt's tokens: no request slides the window), and its round reports
    every token the server made, with the server's CPU per token when it knows its pid.
    (In a child process: measure's absl flags, --workdir among them, may not be defined
    twice in one process, and this worker may already hold another command's.)"""
    import json
    import subprocess
    import sys

    context = httpx.get(f"{server}/v1/models", timeout=10).json()["data"][0]["context_length"]
    code = (
        "import json, sys\n"
        "from transformer.serve import measure\n"
        "fits = measure.in_context_tokens(sys.argv[1])\n"
        "rate, timings, server_ms, client_ms = measure.one_round(sys.argv[1], 2, 4, fits, "
        "pid=int(sys.argv[2]))\n"
        "print(json.dumps(dict(fits=fits, prompt=len(measure.PROMPT), rate=rate, "
        "n=len(timings), server_ms=server_ms, client_ms=client_ms, "
        "none=measure.cpu_seconds(None))))\n")
    # The server's own CPU, read from /proc in clock ticks (10 ms): 8 requests of ~60 tokens
    # take it several ticks. (The measuring process itself, which a first version read,
    # spends under a tick on two requests now that its clients are built before the clock.)
    done = subprocess.run([sys.executable, "-c", code, server, str(SERVER_PID[server])],
                          capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fits"] == context - got["prompt"]  # a byte tokenizer: one token a byte
    assert got["rate"] > 0 and got["n"] == 8 and got["server_ms"] > 0 and got["client_ms"] >= 0
    assert got["none"] == 0.0


def test_concurrent_clients_each_get_their_own_text(client):
    requests = [dict(prompt=p, seed=s, max_tokens=24, temperature=1.0)
                for p in ("the ", "a lazy ") for s in range(4)]
    alone = [client.completions.create(model="tiny", **r).choices[0].text for r in requests]
    together = [None] * len(requests)

    def ask(i):
        together[i] = client.completions.create(model="tiny", **requests[i]).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone
    assert len(set(alone)) > 4  # seeds and prompts give different texts


def test_a_cancelled_job_stops_the_device_loop_at_its_next_chunk(workdir):
    """In-process: the job is cancelled as its first piece of text arrives (as a client that
    leaves); the decode loop ends within a chunk instead of making all max_tokens."""
    from transformer.checkpoint import load_run
    from transformer.generate.decode import STREAM_EVERY
    from transformer.serve import api
    from transformer.serve.engine import Engine

    run_ = load_run(workdir)
    engine = Engine(run_.model_config, run_.params, run_.tokenizer, max_tokens=MAX_TOKENS)
    request = api.parse_completion(dict(prompt=PROMPT, max_tokens=MAX_TOKENS, seed=0), MAX_TOKENS)
    ids = [engine.encode(PROMPT)]
    holder = {}

    def emit(index, piece):
        holder["job"].cancel()

    holder["job"] = job = engine.submit(lambda job: engine.complete(job, request, ids, emit))
    [choice] = job.future.result(timeout=120)
    assert job.stopped and engine.stats["cancelled"] == 1
    assert 0 < len(choice.ids) <= STREAM_EVERY < MAX_TOKENS
    assert engine.stats["tokens"] <= STREAM_EVERY
    # A job whose client left before it ran never runs.
    engine.submit(lambda job: time.sleep(0.5))
    queued = engine.submit(lambda job: engine.complete(job, request, ids))
    queued.cancel()
    with pytest.raises(Exception):
        queued.future.result(timeout=60)
    assert queued.future.cancelled() and engine.stats["cancelled"] == 2
    engine.close()


def test_a_client_that_leaves_while_queued_costs_no_device_time(server):
    """Over HTTP: a stream opened behind a long request and dropped at once never runs."""
    def served():
        return httpx.get(f"{server}/health", timeout=10).json()["served"]

    def wait_until(predicate):
        deadline = time.monotonic() + 60
        while not predicate(now := served()):
            assert time.monotonic() < deadline, f"timed out: {now}"
            time.sleep(0.05)
        return now

    # 8 prompts x 16 choices x up to MAX_TOKENS tokens, one generate call after the other
    # (a call ends early once all its choices made the end-of-text token): first alone, for
    # what it costs.
    long = dict(prompt=[PROMPT] * 8, max_tokens=MAX_TOKENS, n=16, temperature=1.0, seed=1)
    start = served()
    httpx.post(f"{server}/v1/completions", json=long, timeout=300).raise_for_status()
    before = served()
    cost = before["tokens"] - start["tokens"]
    assert cost > 8 * MAX_TOKENS
    thread = threading.Thread(target=lambda: httpx.post(f"{server}/v1/completions", json=long,
                                                        timeout=300))
    thread.start()
    wait_until(lambda s: s["jobs"] == before["jobs"] + 1)  # the long one is running
    with httpx.stream("POST", f"{server}/v1/completions", json=dict(
            prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True), timeout=60) as r:
        assert r.status_code == 200  # headers only: hang up
    thread.join(timeout=300)
    after = wait_until(lambda s: s["cancelled"] > before["cancelled"])
    assert after["jobs"] == before["jobs"] + 1  # the long one only
    assert after["tokens"] == before["tokens"] + cost



def test_compiled_attention_equals_the_eager_look_inside(tiny_config, tiny_params):
    """What the page shows (one compiled pass on a padded bucket) is what visualize draws."""
    from transformer.generate import inside

    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8]  # 19: padded to 32
    weights, logits = inside.attention(tiny_config, tiny_params, tokens)
    eager_weights, eager_logits, _ = inside.look_inside(tiny_config, tiny_params, tokens)
    assert weights.shape == eager_weights.shape == (2, 4, 19, 19)
    np.testing.assert_allclose(weights, eager_weights, atol=1e-5)
    np.testing.assert_allclose(logits, eager_logits, atol=1e-4)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)  # each query's softmax

@pytest.mark.parametrize("args, message", [
    ((), "give one of --workdir=RUN or --hf=FOLDER"),
    (("--workdir=no/such/run",), "no such folder"),
    (("--workdir={empty}",), "no checkpoints"),
    (("--workdir={empty}", "--max_tokens=0"), "max_tokens=0"),
])
def test_bad_command_lines_are_one_line_errors(tmp_path, args, message):
    from tests.conftest import run_cli

    result = run_cli("-m", "transformer", "serve",
                     *(a.format(empty=tmp_path) for a in args), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert message in line

# --- the page in a real headless browser -----------------------------------------------------
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    import shutil
    return shutil.which("chromium") or shutil.which("chromium-browser")


def drive_page(base: str, screenshot, prompt: str = PROMPT, max_tokens: int = 60,
               click: int = -1) -> dict:
    """Opens the page in headless Chromium (the system's: nothing is downloaded), types a
    prompt, generates, clicks a token, and saves a screenshot. Returns what it saw."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(base + "/")
            page.wait_for_function("document.getElementById('model').textContent"
                                   ".includes('step')")
            page.fill("#prompt", prompt)
            page.fill("#max_tokens", str(max_tokens))
            page.click("#generate")
            page.wait_for_selector("#output .tok", timeout=120_000)
            seen = {"pieces": page.evaluate("window.__pieces"),
                    "text": page.inner_text("#output"),
                    "tokens": page.locator("#output .tok").count()}
            page.locator("#output .tok").nth(click).click()
            page.wait_for_selector("#inside:not([hidden]) .head")
            seen["heads"] = page.locator("#heads .head").count()
            seen["cells"] = page.locator("#heads .head").first.locator(".cell").count()
            seen["next"] = page.locator("#next tr").count()
            seen["title"] = page.inner_text("#inside-title")
            page.screenshot(path=str(screenshot), full_page=True)
            return seen
        finally:
            browser.close()


@pytest.mark.browser
def test_the_page_streams_text_and_shows_attention_in_headless_chromium(server, workdir,
                                                                        tmp_path):
    import os
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium); docs/testing.md")
    pytest.importorskip("playwright")
    from transformer.checkpoint import load_run

    config = load_run(workdir).model_config
    seen = drive_page(server, tmp_path / "page.png", max_tokens=40)
    assert seen["pieces"] > 1  # the text came in pieces, as it was made
    assert seen["text"].replace("⏎", "").startswith(PROMPT)
    # A char model: a token per character; the page looks at the model's context's worth.
    assert seen["tokens"] == min(len(PROMPT) + 40, config.max_seq_len)
    assert seen["heads"] == config.n_layers * config.n_heads
    assert seen["cells"] == seen["tokens"]  # the last token attends over all before it
    assert seen["next"] == 8
    assert (tmp_path / "page.png").stat().st_size > 10_000

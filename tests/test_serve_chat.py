"""Chat completions and the rest of the API clients send, through the official `openai`
client against a real server (a byte-level run, so any text is a prompt):

- a chat reply is the completion of the messages rendered through the plain template, ended
  also where the model starts another turn; streamed deltas join to the same reply;
- stream_options.include_usage gives a last chunk with the usage, and is refused where it
  cannot apply (never ignored);
- a prompt past the context is refused (400 context_length_exceeded), not cut;
- /v1/models gives the context length.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve_run import CONTEXT, byte_run, server
from tests.test_resume import run

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "be terse."},
            {"role": "user", "content": "the quick fox"}]
PLAIN = "system: be terse.\nuser: the quick fox\nassistant:"
PLAIN_STOPS = ["\nsystem:", "\ndeveloper:", "\nuser:", "\nassistant:"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with server(byte_run(tmp_path_factory), max_tokens=48) as (url, _):
        yield url


@pytest.fixture()
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("knobs", [dict(n=1, temperature=0.0, seed=0),
                                   dict(n=3, temperature=1.0, seed=5, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_chat_reply_is_the_completion_of_the_plain_template(client, knobs):
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                           **knobs)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    plain = client.completions.create(model="tiny", prompt=PLAIN, max_tokens=40,
                                      stop=PLAIN_STOPS, **knobs)
    choices = sorted(reply.choices, key=lambda c: c.index)
    texts = sorted(plain.choices, key=lambda c: c.index)
    assert [c.index for c in choices] == list(range(knobs["n"]))
    assert [c.message.content for c in choices] == [c.text for c in texts]
    assert all(c.message.role == "assistant" for c in choices)
    assert [c.finish_reason for c in choices] == [c.finish_reason for c in texts]
    assert reply.usage.prompt_tokens == len(PLAIN.encode()) == plain.usage.prompt_tokens
    assert reply.usage.completion_tokens == plain.usage.completion_tokens > 0
    if knobs["n"] > 1:
        assert len({c.message.content for c in choices}) > 1


@pytest.mark.parametrize("field", ["stream", "logprobs"])
def test_null_flags_mean_their_default(base, field):
    """OpenAI types chat's stream and logprobs "boolean or null"; null got 400."""
    r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 4, field: None})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_a_chat_without_a_limit_is_not_cut_at_sixteen_tokens(client):
    """OpenAI's chat has no default max_completion_tokens (16 is the legacy completions'
    default); a client that sets none got 16 tokens and finish_reason "length"."""
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0.0,
                                           max_tokens=48)  # the server's --max_tokens
    assert whole.usage.completion_tokens > 16  # else this test would show nothing
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0.0)
    assert reply.choices[0].message.content == whole.choices[0].message.content
    assert reply.usage == whole.usage


@pytest.mark.parametrize("include_usage", [True, False])
def test_streamed_deltas_join_to_the_reply_and_usage_comes_last_when_asked(client,
                                                                           include_usage):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=40, n=2, temperature=1.0, seed=9)
    whole = client.chat.completions.create(**args)
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(client.chat.completions.create(stream=True, **args, **extra))
    texts, roles, finish = {}, {}, {}
    for chunk in chunks[:-1] if include_usage else chunks:
        assert chunk.object == "chat.completion.chunk" and chunk.usage is None
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles[c.index] = c.delta.role
            if c.finish_reason:
                assert c.index not in finish  # once per choice
                finish[c.index] = c.finish_reason
    by_index = sorted(whole.choices, key=lambda c: c.index)
    assert [texts[i] for i in range(2)] == [c.message.content for c in by_index]
    assert roles == {0: "assistant", 1: "assistant"}
    assert [finish[i] for i in range(2)] == [c.finish_reason for c in by_index]
    if include_usage:
        last = chunks[-1]
        assert last.choices == [] and last.usage == whole.usage


def test_stream_options_that_cannot_apply_are_refused(client):
    for extra, param in ((dict(stream_options={"include_usage": True}), "stream_options"),
                         (dict(stream=True, stream_options={"continuous_usage_stats": True}),
                          "stream_options"),
                         (dict(stream=True, stream_options={"include_usage": "yes"}),
                          "stream_options")):
        for create in (client.chat.completions.create, client.completions.create):
            body = dict(messages=MESSAGES) if create == client.chat.completions.create \
                else dict(prompt="the ")
            with pytest.raises(openai.BadRequestError) as caught:
                create(model="tiny", max_tokens=4, **body, **extra)
            assert caught.value.body["param"] == param


def test_completions_stream_usage_last(client):
    args = dict(model="tiny", prompt="лиса ", max_tokens=12, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **args))
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == whole.choices[0].text


@pytest.mark.parametrize("body, param", [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages"),
    (dict(messages=MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    (dict(messages=MESSAGES, logprobs=True), "logprobs"),
    (dict(messages=MESSAGES, response_format={"type": "json_object"}), "response_format"),
    (dict(messages=MESSAGES, max_completion_tokens=0), "max_completion_tokens"),
    (dict(messages=MESSAGES, n=17), "n"),
])
def test_bad_chat_requests_get_400_with_openai_error_json(client, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", **body)
    error = caught.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] and "\n" not in error["message"]


def test_text_content_parts_are_joined(client):
    parts = [{"type": "text", "text": "the quick "}, {"type": "text", "text": "fox"}]
    a = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0,
                                       messages=[MESSAGES[0], {"role": "user", "content": parts}])
    b = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0,
                                       messages=MESSAGES)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_a_prompt_past_the_context_is_refused_with_context_length_exceeded(client):
    """Today's behaviour was to continue from the prompt's last 64 tokens and answer 200."""
    fits = "я" * (CONTEXT // 2)  # 2 bytes each: exactly the context
    assert client.completions.create(model="tiny", prompt=fits, max_tokens=2).choices
    for prompt in (fits + "x", [65] * (CONTEXT + 1), ["ok", "x" * 100_000]):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert caught.value.body["code"] == "context_length_exceeded"
        assert f"{CONTEXT} tokens" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", max_tokens=2,
                                       messages=[{"role": "user", "content": "лиса " * 20}])
    assert caught.value.body["code"] == "context_length_exceeded"
    assert caught.value.body["param"] == "messages"


def test_models_give_the_context_length(client):
    [card] = client.models.list().data
    assert card.id == "tiny" and card.context_length == CONTEXT


def test_a_folders_chat_template_is_rendered_sandboxed(tmp_path):
    from transformer.serve.chat import ChatTemplate, template_of

    assert template_of(None) == ChatTemplate() and template_of(tmp_path) == ChatTemplate()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}"
                         "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}[assistant]"
                         "{% endif %}"}))
    template = template_of(tmp_path)
    assert template.render(MESSAGES) == (
        "<s>[system] be terse.</s>\n[user] the quick fox</s>\n[assistant]")
    assert template.stops == ()  # the folder's model ends its turns with its own tokens
    evil = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(Exception):
        evil.render(MESSAGES)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The byte run exported once (`python -m transformer export`); each test copies it."""
    folder = tmp_path_factory.mktemp("chat-export") / "hf"
    out = run(["-m", "transformer", "export", f"--workdir={byte_run(tmp_path_factory)}",
               f"--out={folder}"])
    assert out.returncode == 0, out.stderr
    return folder


# split_special_tokens, as this project's exports set it, with -m slow (a server of its own,
# ~5 s of CPU): the default run serves a folder that keeps its special tokens whole.
@pytest.mark.parametrize("split", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_folders_template_writes_its_special_tokens_as_transformers_does(tmp_path_factory,
                                                                            exported, split):
    """A folder's chat template writes its model's special tokens (bos_token, <|im_start|>,
    here eos_token after each turn); they were encoded as their spelling (<|endoftext|> as 13
    byte tokens), so a Llama- or Qwen-style folder's model never saw the turns it was trained
    on. The prompt is now the ids transformers' apply_chat_template gives on the folder, and
    the reply their completion: the token itself where the folder keeps special tokens whole,
    its spelling where it sets split_special_tokens (as this project's exports do)."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat") / "hf"
    shutil.copytree(exported, folder)
    spec = json.loads((folder / "tokenizer_config.json").read_text())
    spec["chat_template"] = ("{% for m in messages %}{{ m.role }}: {{ m.content }}"
                             "{{ eos_token }}{% endfor %}"
                             "{% if add_generation_prompt %}assistant:{% endif %}")
    spec["split_special_tokens"] = split
    (folder / "tokenizer_config.json").write_text(json.dumps(spec))
    # spelled out, the end token is 13 byte tokens a turn: one short turn fits the context
    messages = [{"role": "user", "content": "fox"}] if split else MESSAGES
    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # the end-of-text token once per turn, or never (its 13 characters instead)
    assert ids.count(256) == (0 if split else len(messages))
    # one row: the two requests run one after the other (batching is test_serve_batching's)
    with server(folder, "--max_batch=1", max_tokens=16, hf=True) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=messages,
                                               temperature=0.0, max_tokens=16)
        plain = client.completions.create(model="tiny", prompt=ids, temperature=0.0,
                                          max_tokens=16)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.content == plain.choices[0].text

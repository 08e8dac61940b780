"""Streamed text equals the whole text, and never shows half a character."""

import random

import pytest

from tests.conftest import train_quietly
from transformer.data import tokenizers
from transformer.generate.text import REPLACEMENT, TextStream, encode_prompt


def _stream(tokenizer, ids):
    stream, pieces = TextStream(tokenizer), []
    for i in ids:
        pieces.append(stream.push(i))
    pieces.append(stream.finish())
    return pieces


def test_byte_stream_holds_back_unfinished_characters():
    tok = tokenizers.ByteTokenizer()
    text = "naïve 中文 ok 😀!"
    pieces = _stream(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)
    assert "中" in pieces and "😀" in pieces  # shown whole, the moment its last byte came


def test_streams_equal_the_whole_decode_even_for_broken_bytes():
    tok, rng = tokenizers.ByteTokenizer(), random.Random(0)
    for _ in range(200):
        ids = [rng.choice([0x41, 0x20, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xAF])
               for _ in range(rng.randint(1, 30))]
        assert "".join(_stream(tok, ids)) == tok.decode(ids)


def test_bpe_and_char_streams_equal_the_whole_decode():
    corpus = "def f(x):\n    return x * 2  # 中文注释\n" * 30
    bpe = tokenizers.BPETokenizer.train(corpus, 300)
    ids = bpe.encode("def g(y): return y  # 中文")
    pieces = _stream(bpe, ids)
    assert "".join(pieces) == bpe.decode(ids) and not any(REPLACEMENT in p for p in pieces)
    char = tokenizers.CharTokenizer.from_text(corpus)
    ids = char.encode("def 中文")
    assert _stream(char, ids)[:-1] == list("def 中文")


def test_a_prompt_longer_than_the_context_is_cut_with_one_note():
    notes = []
    ids = encode_prompt(tokenizers.ByteTokenizer(), "abcdefghij", 4, log=notes.append)
    assert ids == list(b"ghij") and len(notes) == 1 and "last 4 tokens" in notes[0]
    assert encode_prompt(tokenizers.ByteTokenizer(), "abc", 4, log=notes.append) == list(b"abc")
    assert len(notes) == 1


def test_a_prompt_cut_to_the_context_keeps_the_folders_bos_first():
    """A Hugging Face folder's BOS (prefix_ids, hf/load.starting_at) starts every prompt, a
    cut one too: the model was trained to see it first."""
    tok = tokenizers.ByteTokenizer(eot=True)
    tok.prefix_ids = (256,)
    notes = []
    assert encode_prompt(tok, "abc", 8, log=notes.append) == [256, *b"abc"] and not notes
    assert encode_prompt(tok, "abcdefghij", 4, log=notes.append) == [256, *b"hij"]
    assert len(notes) == 1 and "last 3 tokens after its BOS" in notes[0]


def test_stop_strings_cut_at_the_first_match_and_streams_hold_back_a_possible_start():
    from transformer.generate.text import StopText, cut_at_stop
    assert cut_at_stop("ab\ncd\nef", ["\n"]) == "ab"
    assert cut_at_stop("abcEND x STOP", ["STOP", "END"]) == "abc"  # the earliest match wins
    assert cut_at_stop("no match", ["\n\n"]) == "no match" and cut_at_stop("x", None) == "x"
    text = "one\n two\n\n three"
    for stops in (["\n\n"], ["two", "\n\n"], ["zz"], ["e\n "]):
        for size in (1, 2, 3):  # pieces of any size: what is shown is the cut text, no more
            cut, shown = StopText(stops), []
            for k in range(0, len(text), size):
                shown.append(cut.push(text[k:k + size]))
            shown.append(cut.finish())
            assert "".join(shown) == cut_at_stop(text, stops), (stops, size)
            assert cut.stopped == (cut_at_stop(text, stops) != text)
    held = StopText(["\n\n"])
    assert held.push("ab\n") == "ab" and held.push("c") == "\nc"  # "\n" waited for its next


def test_overlapping_stop_strings_cut_where_the_first_completes_whatever_the_pieces():
    """With stops that overlap ("xyz" and "y"; "bc" and "abcd"), a streamed sample stops at
    the first stop string its text completes, and cuts at that one's start: the same text
    for every way of cutting it into pieces, and the same as the whole text's cut (the
    unstreamed and multi-device paths)."""
    import random

    from transformer.generate.text import StopText, cut_at_stop
    assert cut_at_stop("abxyz", ["xyz", "y"]) == "abx"
    assert cut_at_stop("abxyz", ["y", "xyz"]) == "abx"
    assert cut_at_stop("xabcd", ["abcd", "bc"]) == "xa"
    assert cut_at_stop("xabc", ["abc", "bc"]) == "x"  # completed by the same character
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("abxyz") for _ in range(rng.randint(0, 12)))
        stops = ["".join(rng.choice("abxyz") for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        expected = cut_at_stop(text, stops)
        cut, shown, k = StopText(stops), [], 0
        while k < len(text):
            n = rng.randint(1, 4)
            shown.append(cut.push(text[k:k + n]))
            k += n
        shown.append(cut.finish())
        assert "".join(shown) == expected, (text, stops)
        char_by_char = StopText(stops)
        one = "".join(char_by_char.push(c) for c in text) + char_by_char.finish()
        assert one == expected, (text, stops)


def test_stop_ends_every_bpe_sample_at_its_first_newline(tmp_path):
    """With BPE a newline is mostly inside longer tokens ("\\n    "): stopping on the newline
    token alone let samples run on over several lines. Stop strings are matched in the text."""
    from pathlib import Path

    from transformer import config as config_lib
    from transformer.config import ModelConfig
    from transformer.generate import text as textgen

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n\n" * 300
                      + "class Point:\n    x = 1\n        y = 2\n" * 150)
    c = config_lib.base_config()
    c.model.update(vocab_size=0, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32)
    c.data.update(corpus=str(corpus), tokenizer="bpe", bpe_vocab_size=300)
    c.train.update(steps=30, batch_size=4, lr=1e-2, log_every=10, eval_every=30,
                   eval_batches=1, ckpt_every=30, warmup_steps=0)
    c.sample.max_new_tokens = 8
    state, the_run = train_quietly(c, tmp_path / "run")
    tok = the_run.tokenizer
    assert tok.encode("\n") != tok.encode("\n    ")[:1]  # the newline is merged in BPE
    model = ModelConfig.from_config(the_run.config)  # vocab_size=0 as the run filled it in
    kwargs = dict(num_samples=6, max_new_tokens=60, temperature=1.0, seed=1)
    free = textgen.sample_text(model, state.params, tok, "def", **kwargs)
    assert sum(t.count("\n") > 1 for t in free) >= 3  # the samples do run over several lines
    stopped = textgen.sample_text(model, state.params, tok, "def", stop="\n", **kwargs)
    assert stopped == [t.split("\n")[0] for t in free]
    pieces = []
    [streamed] = textgen.sample_text(model, state.params, tok, "def", stop=["\n", "zzz"],
                                     on_text=pieces.append, **{**kwargs, "num_samples": 1})
    assert "".join(pieces) == streamed == free[0].split("\n")[0]

    root = Path(__file__).resolve().parents[1]
    from tests.conftest import fork_run
    out = fork_run("sample.py", f"--workdir={tmp_path / 'run'}", "--prompt=def", "--stop=\n",
                   "--num_samples=4", "--max_new_tokens=60", "--temperature=1", cwd=root,
                   timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    samples = out.stdout.split("--- sample ")[1:]
    assert len(samples) == 4
    for sample in samples:  # header line, then "def" + the text up to its first newline
        _header, body = sample.split("\n", 1)
        assert "\n" not in body.rstrip("\n"), sample


def _free_sample_and_an_end_token(config, params, prompt):
    """A sample made without an end token (temperature 1; the first seed from 0 whose sample
    has such a token, below), and a char tokenizer whose end-of-text id is a token it makes
    later, above every token before it (so those decode to characters): that token's first
    appearance is where the same sample must end with it. Returns (free, position, tok, seed)."""
    from transformer.generate import decode
    for seed in range(20):
        [free] = decode.generate(config, params, [prompt], max_new_tokens=24, seed=seed)
        position = next((i for i in range(2, 24) if free[i] > max([*prompt, *free[:i]])), None)
        if position is not None:
            break
    eot = int(free[position])
    tok = tokenizers.CharTokenizer("".join(chr(0x4E00 + i) for i in range(eot)), eot=True)
    return free, position, tok, seed


def test_a_sample_ends_where_the_model_makes_the_end_of_text_token(tiny_config, tiny_params):
    """Token i of a sample does not depend on whether the row stops later (keys per seed,
    row and position): the sample with an end-of-text token is the one without, cut before
    that token's first appearance; streamed and with a host-checked stop string too."""
    from transformer.generate.text import sample_text
    prompt = [1, 2, 3]
    free, position, tok, seed = _free_sample_and_an_end_token(tiny_config, tiny_params, prompt)
    prompt_text = tok.decode(prompt)
    assert tok.encode(prompt_text) == prompt and position >= 2
    [text] = sample_text(tiny_config, tiny_params, tok, prompt_text, max_new_tokens=24,
                         seed=seed)
    assert text == tok.decode(free[:position]) and len(text) == position
    streamed = []
    [again] = sample_text(tiny_config, tiny_params, tok, prompt_text, max_new_tokens=24,
                          seed=seed, on_text=streamed.append, stop=["never there"])
    assert again == text == "".join(streamed)


def test_a_sample_ends_at_any_of_a_folders_end_tokens(tiny_config, tiny_params):
    """A folder may list several end tokens (Llama 3.1: <|end_of_text|>, <|eom_id|>,
    <|eot_id|>; hf/load.ending_at sets them as `end_ids`): a sample ends before the first of
    any, not only the one the device stops at; streamed and served alike. It ran on past
    the others."""
    from transformer.generate.text import sample_text
    from transformer.serve import api
    from transformer.serve.engine import Engine
    prompt = [1, 2, 3]
    free, position, _, seed = _free_sample_and_an_end_token(tiny_config, tiny_params, prompt)
    other = int(free[position])  # above every token before it
    # the device's end token: above the tokens before `position` too, and not `other`
    device = next(i for i in range(max([*prompt, *free[:position]]) + 1, other + 2)
                  if i != other)
    tok = tokenizers.CharTokenizer("".join(chr(0x4E00 + i) for i in range(device)), eot=True)
    tok.end_ids = (device, other)
    prompt_text = tok.decode(prompt)
    streamed = []
    [alone] = sample_text(tiny_config, tiny_params, tok, prompt_text, max_new_tokens=24,
                          seed=seed, on_text=streamed.append)
    assert alone == "".join(streamed) == tok.decode(free[:position])
    engine = Engine(tiny_config, tiny_params, tok, max_tokens=24)
    request = api.parse_completion(dict(prompt=prompt_text, max_tokens=24, seed=seed), 24)
    job = engine.submit(lambda job: engine.complete(job, request, [prompt]))
    [choice] = job.future.result(timeout=120)
    engine.close()
    assert choice.text == alone and choice.finish_reason == "stop"


def test_a_served_choice_ends_at_the_end_of_text_token_with_finish_reason_stop(
        tiny_config, tiny_params):
    from transformer.serve import api
    from transformer.serve.engine import Engine
    prompt = [1, 2, 3]
    free, position, tok, seed = _free_sample_and_an_end_token(tiny_config, tiny_params, prompt)
    engine = Engine(tiny_config, tiny_params, tok, max_tokens=24)
    request = api.parse_completion(dict(prompt=tok.decode(prompt), max_tokens=24, seed=seed),
                                    24)
    job = engine.submit(lambda job: engine.complete(job, request, [prompt]))
    [choice] = job.future.result(timeout=120)
    engine.close()
    assert choice.text == tok.decode(free[:position]) and choice.finish_reason == "stop"
    assert choice.ids == list(free[:position])


def test_a_served_row_gives_the_same_text_a_chunk_at_a_time_as_token_by_token():
    """engine._Row.push_many (a chunk's tokens in one TextStream and one StopText call) gives
    what push gives token by token, joined per chunk: the same pieces, the same text, stop
    and ids kept; on bytes that break characters (held back, then token by token), stop
    strings spanning chunks, and the end-of-text token."""
    from transformer.serve.engine import Engine, _Row
    tok, rng = tokenizers.ByteTokenizer(eot=True), random.Random(1)
    alphabet = list(b"ab \n") + [0xE4, 0xB8, 0xAD, 0xC3, 0xAF, 0xFF, 256]
    ids_within = Engine._ids_within.__get__(type("E", (), {"tokenizer": tok})())
    for trial in range(400):
        stops = rng.choice([None, ["b\n"], ["ab", "\n\n"], ["中a"]])
        ids = [rng.choice(alphabet if trial % 2 else alphabet[:4]) for _ in range(60)]
        one, many = _Row(tok, stops), _Row(tok, stops)
        i = 0
        while i < len(ids):
            k = rng.randint(1, 16)
            chunk = ids[i:i + k]
            assert "".join(one.push(t) for t in chunk) == many.push_many(chunk)
            i += k
        assert one.finish() == many.finish()
        assert (one.text, one.stopped) == (many.text, many.stopped)
        assert ids_within(one) == ids_within(many)


def _sentencepiece_style(decoder: str, vocab_size: int):
    """A BPE tokenizer as Llama 2 / Mistral ship theirs (built here: nothing is downloaded):
    a Metaspace pre-tokenizer ("▁" before each word), decoded by a Metaspace decoder or by
    Llama 2's Replace + ByteFallback + Fuse + Strip sequence: both drop the space of the
    word that starts the text they decode."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=decoder == "llama2"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = (decoders.Metaspace(replacement="▁", prepend_scheme="first")
                   if decoder == "metaspace" else
                   decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)]))
    text = "the cat sat on a mat and the dog ate a hat; a bat, a rat and a man ran\n" * 20
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size,
                                                        show_progress=False))
    return tokenizers.BPETokenizer(tok)


@pytest.mark.parametrize("decoder", ["metaspace", "llama2"])
def test_sentencepiece_style_text_keeps_the_spaces_between_words(decoder, tiny_config,
                                                                  tiny_params):
    """Streamed pieces join to the whole decode, and a sample is the text its tokens add to
    the prompt's: prompt + sample == decode(prompt ids + sample ids), spaces included (each
    token decoded alone drops its word's space: "the cat" streamed as "thecat")."""
    from transformer.generate import decode
    from transformer.generate.text import sample_text
    tok = _sentencepiece_style(decoder, tiny_config.vocab_size)
    ids = tok.encode("the cat sat on a mat")
    assert "".join(_stream(tok, ids)) == tok.decode(ids) == "the cat sat on a mat"
    prompt = "the cat"
    prompt_ids = tok.encode(prompt)
    [row] = decode.generate(tiny_config, tiny_params, [prompt_ids], max_new_tokens=12, seed=0)
    assert any((tok.hf_tokenizer().id_to_token(i) or "").startswith("▁") for i in row[1:])
    streamed = []
    [text] = sample_text(tiny_config, tiny_params, tok, prompt, max_new_tokens=12, seed=0,
                         end_at_eot=False, on_text=streamed.append)
    assert prompt + text == tok.decode(prompt_ids + row)
    assert "".join(streamed) == text
    from transformer.serve import api
    from transformer.serve.engine import Engine
    engine = Engine(tiny_config, tiny_params, tok, max_tokens=12)
    request = api.parse_completion(dict(prompt=prompt, max_tokens=12, seed=0), 12)
    job = engine.submit(lambda job: engine.complete(job, request, [prompt_ids]))
    [choice] = job.future.result(timeout=120)
    engine.close()
    assert prompt + choice.text == tok.decode(prompt_ids + choice.ids)


def test_a_one_character_stop_the_char_tokenizer_lacks_never_matches(tiny_config,
                                                                     tiny_params):
    """A stop is text to look for, not text to encode: one character outside a char
    tokenizer's vocabulary can never appear, so the sample is the one without the stop (as
    for a longer stop it lacks), not a TokenizerError."""
    from transformer.generate.text import sample_text
    tok = tokenizers.CharTokenizer("".join(chr(0x4E00 + i) for i in range(64)))
    kwargs = dict(max_new_tokens=8, seed=0)
    free = sample_text(tiny_config, tiny_params, tok, "丁", **kwargs)
    assert sample_text(tiny_config, tiny_params, tok, "丁", stop="Z", **kwargs) == free
    assert sample_text(tiny_config, tiny_params, tok, "丁", stop="ZZ", **kwargs) == free

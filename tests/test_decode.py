"""Cached generation must compute exactly what the full forward pass computes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import decode, kvcache
from transformer.model import GPT, stack_layers

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA compilations while active (jax.monitoring events)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event == COMPILE_EVENT:
            self.count += 1

    def close(self):
        jax.monitoring.unregister_event_duration_listener(self._on_event)


def _full_logits(config, params, seq):
    return GPT(config).apply({"params": params}, jnp.asarray([seq]))[0]


def test_prefill_and_decode_match_full_forward_at_every_position(tiny_config, tiny_params):
    """Left-padded prompts of several lengths in one batch, then teacher-forced decode steps."""
    rng = np.random.default_rng(0)
    lengths, extra = [3, 9, 16], 6
    seqs = [rng.integers(0, tiny_config.vocab_size, size=n + extra).tolist() for n in lengths]
    P = 16
    prompt_BP = np.zeros((len(seqs), P), np.int32)
    start_B = np.array([P - n for n in lengths], np.int32)
    for b, (seq, n) in enumerate(zip(seqs, lengths)):
        prompt_BP[b, P - n:] = seq[:n]
    cache = kvcache.init_cache(len(seqs), tiny_config.n_layers, tiny_config.n_heads,
                               tiny_config.max_seq_len, tiny_config.head_dim)
    logits_BPV, cache = decode._forward(tiny_config, tiny_params, prompt_BP, cache, 0, start_B)
    steps = []
    for i in range(extra):
        token_B = np.array([seq[n + i] for seq, n in zip(seqs, lengths)], np.int32)
        step_logits, cache = decode._forward(tiny_config, tiny_params, token_B[:, None], cache,
                                             P + i, start_B)
        steps.append(step_logits[:, 0])
    for b, (seq, n) in enumerate(zip(seqs, lengths)):
        full = _full_logits(tiny_config, tiny_params, seq)
        np.testing.assert_allclose(logits_BPV[b, P - n:], full[:n], atol=1e-5, rtol=1e-5)
        for i in range(extra):
            np.testing.assert_allclose(steps[i][b], full[n + i], atol=1e-5, rtol=1e-5)


def _naive_greedy(config, params, prompt, n):
    """Reruns the whole model for every new token. The sequence is padded to the full context
    so one compiled forward serves every step; causality makes the padding invisible."""
    forward = jax.jit(lambda tokens: GPT(config).apply({"params": params}, tokens))
    seq = np.zeros((1, config.max_seq_len), np.int32)
    seq[0, : len(prompt)] = prompt
    for t in range(len(prompt), len(prompt) + n):
        seq[0, t] = int(jnp.argmax(forward(seq)[0, t - 1]))
    return seq[0, len(prompt): len(prompt) + n].tolist()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_greedy_scan_decoding_equals_naive_full_recompute(tiny_config, tiny_params, scan_layers):
    config, params = tiny_config, tiny_params
    if scan_layers:
        config = dataclasses.replace(tiny_config, scan_layers=True)
        params = stack_layers(tiny_params, tiny_config.n_layers)
    # 40 new tokens after a 16-slot bucket run through caches of 32 and 64 slots (segments).
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [42]]
    out = decode.generate(config, params, prompts, max_new_tokens=40, temperature=0.0)
    for prompt, tokens in zip(prompts, out):
        assert tokens == _naive_greedy(tiny_config, tiny_params, prompt, 40)


def test_a_batch_of_one_decodes_like_a_row_of_a_batch(tiny_config, tiny_params):
    """Batch 1 has a cache with no size-1 axis and its own compiled program: same tokens."""
    prompt = [5, 6, 7, 8, 9]
    alone = decode.generate(tiny_config, tiny_params, [prompt], max_new_tokens=30,
                            temperature=0.0)
    assert alone == [_naive_greedy(tiny_config, tiny_params, prompt, 30)]
    in_batch = decode.generate(tiny_config, tiny_params, [prompt, [1, 2]], max_new_tokens=30,
                               temperature=0.0)
    assert in_batch[0] == alone[0]


@pytest.mark.parametrize("P,new,S", [(16, 8, 64), (16, 49, 64), (32, 200, 512), (16, 1, 64),
                                     (64, 400, 505), (256, 257, 512)])
def test_decode_segments_cover_every_step_with_room_for_its_slot(P, new, S):
    pieces = decode.segments(P, new, S)
    steps = [i for first, stop, _ in pieces for i in range(first, stop)]
    assert steps == list(range(new - 1))  # every scan step once, in order
    for first, stop, length in pieces:
        assert first < stop and P + stop <= length <= S  # the last slot written fits
        assert length == S or (length & (length - 1) == 0 and length < 2 * (P + stop))
    assert len(pieces) <= int(np.log2(S)) + 1  # a handful of scans, not one per token


def test_sampling_knobs_seed_and_prompt_do_not_recompile(tiny_config, tiny_params):
    kwargs = dict(max_new_tokens=8)
    decode.generate(tiny_config, tiny_params, [[1, 2, 3], [4]], temperature=0.0, **kwargs)
    counter = CompileCounter()
    try:
        decode.generate(tiny_config, tiny_params, [[9, 9, 9, 9, 9], [7, 1]], temperature=0.7,
                        top_k=5, top_p=0.9, seed=3, eos_id=4, **kwargs)
        decode.generate(tiny_config, tiny_params, [[2] * 16, [3] * 11], temperature=1.3,
                        top_k=0, top_p=0.5, seed=11, **kwargs)
    finally:
        counter.close()
    assert counter.count == 0


def test_prompt_lengths_share_a_handful_of_buckets():
    buckets = {decode.prompt_bucket(n, 8, 512) for n in range(1, 505)}
    assert buckets == {16, 32, 64, 128, 256, 505}
    assert all(decode.prompt_bucket(n, 8, 512) >= n for n in range(1, 505))


def test_generation_stops_at_end_token(tiny_config, tiny_params):
    prompts = [[1, 2, 3], [7, 8]]
    free = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=10, temperature=0.0)
    eos = free[0][3]
    cut = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=10, temperature=0.0,
                          eos_id=eos)
    for row_free, row_cut in zip(free, cut):
        expected = row_free[: row_free.index(eos)] if eos in row_free else row_free
        assert row_cut == expected
    assert len(cut[0]) == free[0].index(eos)


def test_tokens_after_the_end_token_are_padding(tiny_config, tiny_params):
    free = decode.generate(tiny_config, tiny_params, [[1, 2, 3]], max_new_tokens=10,
                           temperature=0.0)[0]
    eos, P = free[1], 16
    prompt = np.zeros((1, P), np.int32)
    prompt[0, -3:] = [1, 2, 3]
    tokens, _ = decode.generate_tokens(
        tiny_params, decode.new_cache(config=tiny_config, batch=1), prompt,
        np.array([P - 3], np.int32), jax.random.key(0), jnp.float32(0), jnp.int32(0),
        jnp.float32(1), jnp.int32(eos), config=tiny_config, max_new_tokens=10)
    row = np.asarray(tokens)[0].tolist()
    first = row.index(eos)
    assert row[: first + 1] == free[: first + 1]
    assert all(t == decode.PAD_ID for t in row[first + 1:])


@pytest.mark.parametrize("prompts,new,match", [
    ([[]], 4, "empty"),
    ([list(range(64))], 1, "context holds 64"),
    ([list(range(60))], 8, "at most 4 new tokens"),
])
def test_bad_prompts_are_refused(tiny_config, tiny_params, prompts, new, match):
    with pytest.raises(decode.PromptError, match=match):
        decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=new)

"""Cached generation must compute exactly what the full forward pass computes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import host
from transformer.generate import decode, sampling, step
from transformer.model import kvcache
from transformer.model.gpt import GPT, init_params, stack_layers

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


# Compiled as the decode program runs them (eagerly, each op of every shape was a program of
# its own: ~4 s of the test below); index traced, so the steps share one program.
_jit_forward = jax.jit(step.forward, static_argnums=0)
_jit_full_logits = jax.jit(_full_logits, static_argnums=0)


@pytest.mark.device
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
    logits_BPV, cache = _jit_forward(tiny_config, tiny_params, prompt_BP, cache, 0, start_B)
    steps = []
    for i in range(extra):
        token_B = np.array([seq[n + i] for seq, n in zip(seqs, lengths)], np.int32)
        step_logits, cache = _jit_forward(tiny_config, tiny_params, token_B[:, None], cache,
                                          P + i, start_B)
        steps.append(step_logits[:, 0])
    for b, (seq, n) in enumerate(zip(seqs, lengths)):
        full = _jit_full_logits(tiny_config, tiny_params, np.asarray(seq, np.int32))
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


@pytest.mark.device
@pytest.mark.parametrize("scan_layers", [False, True])
def test_greedy_decoding_within_the_context_equals_naive_full_recompute(tiny_config, tiny_params, scan_layers):
    config, params = tiny_config, tiny_params
    if scan_layers:
        config = dataclasses.replace(tiny_config, scan_layers=True)
        params = stack_layers(tiny_params, tiny_config.n_layers)
    # 40 new tokens after a 16-slot bucket fit the 48 slots left of the 64-slot context: one
    # fill loop (a context of up to MIN_SEGMENT is one piece); test_window.py goes past it.
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
                               temperature=0.0, groups=1)  # the two rows in one program
    assert in_batch[0] == alone[0]


def _while_loops(config, params, prompts, max_new_tokens):
    prompt_BP, start_B = decode.left_pad(prompts, config.max_seq_len)
    lowered = decode._program.lower(
        params, decode.new_cache(config=config, batch=len(prompts)), prompt_BP, start_B,
        jax.random.key(0), np.float32(0), np.int32(0), np.float32(1), np.int32(-1),
        np.int32(max_new_tokens), np.int32(0), np.int32(0), np.int32(start_B.min()),
        config=config,
        budget=decode.token_budget(max_new_tokens, config.max_seq_len - prompt_BP.shape[1]))
    return lowered.as_text().count("stablehlo.while")


def _window_loops(config) -> int:
    """The while loops the window policy adds to a program: the cycle over re-prefills and
    its inner loop of steps, plus the loops inside their two draws (the re-prefill's token
    and the step's: the sampler's threshold searches, sampling._largest_threshold)."""
    logits_1V = np.zeros((1, config.vocab_size), np.float32)
    draw = jax.jit(sampling.sample).lower(logits_1V, np.zeros((1, 2), np.uint32),
                                          np.float32(1), np.int32(0), np.float32(1))
    return 2 + 2 * draw.as_text().count("stablehlo.while")


def test_a_request_that_fits_after_its_prompt_gets_no_window_loop(tiny_config, tiny_params):
    """A 10-token prompt (a 16-slot bucket) and 40 new tokens in a 64-slot context: the
    power-of-two budget (64) would overflow the context, the room after the prompt (48)
    does not, so the program leaves out the window loop; the tokens are the naive
    recomputation's, and 49 tokens (past the room) bring the loop back."""
    prompt = list(range(3, 13))
    S = tiny_config.max_seq_len
    assert decode.token_budget(40) == 64 and decode.token_budget(40, S - 16) == 48
    assert _while_loops(tiny_config, tiny_params, [prompt], 49) - _while_loops(
        tiny_config, tiny_params, [prompt], 40) == _window_loops(tiny_config)
    out = decode.generate(tiny_config, tiny_params, [prompt], max_new_tokens=40, temperature=0.0)
    assert out == [_naive_greedy(tiny_config, tiny_params, prompt, 40)]


def test_a_program_that_cannot_fill_the_cache_leaves_out_the_window_loop(tiny_config,
                                                                         tiny_params):
    """A 32-slot prompt and 32 new tokens in a 64-slot context: the steps write slots 32..62,
    the cache never fills, the program has no re-prefill loop, and the tokens are still the
    naive recomputation's. One more token (a 64-token budget) brings the loop back."""
    prompt = list(range(1, 33))
    S = tiny_config.max_seq_len
    assert decode.prompt_bucket(len(prompt), S) + decode.token_budget(32) == S
    within = _while_loops(tiny_config, tiny_params, [prompt], 32)
    past = _while_loops(tiny_config, tiny_params, [prompt], 33)
    assert past - within == _window_loops(tiny_config), (within, past)
    out = decode.generate(tiny_config, tiny_params, [prompt], max_new_tokens=32, temperature=0.0)
    assert out == [_naive_greedy(tiny_config, tiny_params, prompt, 32)]


@pytest.mark.parametrize("P,S,end", [(16, 64, None), (16, 512, None), (64, 505, None),
                                     (256, 512, None), (64, 64, None), (16, 2048, None),
                                     (300, 4096, None), (16, 512, 271), (16, 64, 31),
                                     (16, 512, 127), (32, 512, 300), (16, 2048, 1000)])
def test_fill_segments_cover_every_slot_with_a_cache_that_holds_it(P, S, end):
    pieces = decode.fill_segments(P, S, end)
    last = S if end is None else min(S, -(-end // decode.MIN_BUCKET) * decode.MIN_BUCKET)
    slots = [s for i, (first, length) in enumerate(pieces)
             for s in range(first, pieces[i + 1][0] if i + 1 < len(pieces) else last)]
    assert slots == list(range(P, last))  # every slot that can be written, once, in order
    for first, length in pieces:
        assert first < length <= last
        # a power of two reading at most about twice the filled slots, or the smallest
        # piece, or the last slots the program can write (rounded up to MIN_BUCKET)
        assert length in (S, last) or (length & (length - 1) == 0
                                        and length <= max(2 * first + 1, decode.MIN_SEGMENT))
    assert len(pieces) <= int(np.log2(S)) + 1  # a handful of loops, not one per token
    if S <= decode.MIN_SEGMENT:  # a small cache is one loop: each piece costs a compile
        assert len(pieces) == (1 if P < last else 0)
    if last < S:  # a budget short of the context never reads past its own slots
        assert pieces[-1][1] == last


def test_a_budget_short_of_a_long_context_reads_only_its_own_slots(tiny_config):
    """120 tokens after a 16-slot prompt in a 256-slot context: a 128-token budget writes
    slots 16 .. 142, so the last loop's cache is cut to 144 slots, not 256; the tokens are
    still the naive recomputation's (the slots past it are never written)."""
    config = dataclasses.replace(tiny_config, max_seq_len=256)
    params = init_params(config, jax.random.key(1))
    budget = decode.token_budget(120, config.max_seq_len - 16)
    assert budget == 128
    assert decode.fill_segments(16, 256, 16 + budget - 1) == [(16, 128), (128, 144)]
    prompt = [7, 3, 9, 1, 4]
    out = decode.generate(config, params, [prompt], max_new_tokens=120, temperature=0.0)
    assert out == [_naive_greedy(config, params, prompt, 120)]


@pytest.mark.device
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


def test_prompt_lengths_and_token_counts_share_a_handful_of_buckets():
    buckets = {decode.prompt_bucket(n, 505) for n in range(1, 506)}
    assert buckets == {16, 32, 64, 128, 256, 505}
    assert all(decode.prompt_bucket(n, 505) >= n for n in range(1, 506))
    assert {decode.token_budget(n) for n in range(1, 2049)} == {2 ** k for k in range(4, 12)}


def test_lengths_in_one_budget_share_one_program(tiny_config, tiny_params):
    """The length is traced: 100 and 120 tokens (budget 128, past the 64-token context) run
    the same compiled program."""
    decode.generate(tiny_config, tiny_params, [[1, 2, 3]], max_new_tokens=100, temperature=0.0)
    counter = CompileCounter()
    try:
        out = decode.generate(tiny_config, tiny_params, [[4, 5]], max_new_tokens=120,
                              temperature=0.5, seed=2)
    finally:
        counter.close()
    assert counter.count == 0 and len(out[0]) == 120


def test_the_first_tokens_do_not_depend_on_how_many_are_asked_for(tiny_config, tiny_params):
    kwargs = dict(temperature=1.0, top_k=20, seed=7)
    short = decode.generate(tiny_config, tiny_params, [[1, 2, 3]], max_new_tokens=60, **kwargs)
    long = decode.generate(tiny_config, tiny_params, [[1, 2, 3]], max_new_tokens=600, **kwargs)
    assert len(long[0]) == 600 and short[0][:50] == long[0][:50]


def test_sample_b_of_a_seed_does_not_depend_on_how_many_decode_with_it(tiny_config,
                                                                       tiny_params):
    """Row b's tokens come from keys of (seed, b, step) and from the same arithmetic at every
    batch size (fast_bf16, what auto picks on a CPU with bf16 units: one row once switched to
    fast_f32), so sample 0 is the same text at --num_samples=1, 2 and 3, and sample 1 at 2
    and 3; different rows still draw different text."""
    config = dataclasses.replace(tiny_config, matmul="fast_bf16")
    # Weights x4: logits of a few units, where bfloat16's rounding (~0.01) moves draws that
    # the near-uniform logits of a fresh model would not show.
    params = jax.tree.map(lambda x: x * 4, tiny_params)
    kwargs = dict(max_new_tokens=200, temperature=1.0, seed=7)
    runs = {n: decode.generate(config, params, [[1, 2, 3]] * n, groups=1, **kwargs)
            for n in (1, 2, 3)}
    assert runs[1][0] == runs[2][0] == runs[3][0]
    assert runs[2][1] == runs[3][1]
    assert runs[3][0] != runs[3][1] != runs[3][2]


# --- a batch as several programs at once (decode_groups) -------------------------------------

# The RoPE ring with -m slow (~9 s of CPU; decoding past the context on the ring is
# test_window's in the default run).
@pytest.mark.parametrize("variant", [{}, pytest.param(dict(position="rope", sliding_window=16),
                                                      marks=pytest.mark.slow)])
def test_groups_of_rows_make_the_tokens_of_one_program(tiny_config, tiny_params, variant):
    """The rows cut into 2 to 8 programs make the one program's tokens: sampled (each
    group keeps its rows' keys), prompts of different lengths, past the context (every group
    keeps the whole batch's layout, so its rows re-prefill at the same token as in one
    program). A group numbering its rows from 0, or laying out its own shorter prompts, gave
    other text."""
    config = dataclasses.replace(tiny_config, **variant)
    params = init_params(config, jax.random.key(0)) if variant else tiny_params
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [3, 4]] * 2
    kwargs = dict(max_new_tokens=100, temperature=0.9, top_k=40, top_p=0.9, seed=3)
    one = decode.generate(config, params, prompts, groups=1, **kwargs)
    assert len({tuple(row) for row in one}) == 8  # every row its own text
    for groups in (2, 3, 4, 8):  # 3 groups of 3 rows: the last holds a copy of row 7
        assert decode.generate(config, params, prompts, groups=groups, **kwargs) == one


def test_groups_run_at_once_each_from_its_own_thread(tiny_config, tiny_params, monkeypatch):
    """decode_groups calls every group's program before any has finished: a barrier that
    the four calls must all reach (run one after another, the first would wait forever)."""
    import threading
    barrier, threads, program = threading.Barrier(4, timeout=30), set(), decode._program

    def arrive(*args, **kwargs):
        threads.add(threading.get_ident())
        barrier.wait()
        return program(*args, **kwargs)

    monkeypatch.setattr(decode, "_program", arrive)
    prompts = [[1, 2, 3]] * 8
    decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=5, groups=4)
    assert len(threads) == 4


def test_row_groups_split_small_models_over_the_cores(tiny_config, monkeypatch):
    """On a CPU: as many equal groups as the cores allow, one for a model whose weights do
    not fit in the cache (its own dots use the cores; the groups would each read them), one
    off the CPU."""
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    assert [decode.row_groups(tiny_config, b) for b in (1, 2, 3, 8)] == [1, 2, 2, 2]
    monkeypatch.setattr(host, "usable_cores", lambda: 8)
    assert [decode.row_groups(tiny_config, b) for b in (6, 7, 8, 16)] == [6, 7, 8, 8]
    monkeypatch.setattr(host, "usable_cores", lambda: 4)  # 5 rows: 2 + 2 + 1, no empty group
    assert [decode.row_groups(tiny_config, b) for b in (3, 5, 7)] == [3, 3, 4]
    monkeypatch.setattr(decode, "_small_weights", lambda: 1000)
    assert decode.row_groups(tiny_config, 8) == 1
    monkeypatch.undo()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert decode.row_groups(tiny_config, 8) == 1


def test_a_generation_whose_buffers_do_not_fit_is_refused(tiny_config, tiny_params,
                                                          monkeypatch):
    """One call takes BYTES_PER_TOKEN a row and token of its budget; past the free memory it is
    refused by name (XLA's out of memory was a traceback, from threads an abort). A streamed
    generation runs in chunks and is not refused. The budget stays an int32."""
    monkeypatch.setattr(decode, "_available_memory", lambda: 2 * 32 * decode.BYTES_PER_TOKEN)
    assert decode.generate(tiny_config, tiny_params, [[1], [2]], max_new_tokens=20) != []
    with pytest.raises(decode.GenerationError, match="max_new_tokens=40 for 2 row.*GiB"):
        decode.generate(tiny_config, tiny_params, [[1], [2]], max_new_tokens=40)
    streamed = []
    decode.generate(tiny_config, tiny_params, [[1]], max_new_tokens=5000,
                    on_tokens=lambda i, tokens_B, done_B: streamed.append(i))
    assert len(streamed) == 5000
    assert decode.token_budget(2**31 - 1) == 2**31 - 1


def test_a_containers_cpu_quota_and_memory_limit_count(tmp_path):
    """A container's `--cpus=1.5` (cgroup v2 cpu.max "150000 100000") leaves 2 cores of the
    ones taskset allows, "max" all of them; its memory.max caps what MemAvailable says."""
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert host.usable_cores(tmp_path) == min(2, host.usable_cores(tmp_path / "none"))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert host.usable_cores(tmp_path) == host.usable_cores(tmp_path / "none")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n")
    assert host.available_memory(meminfo, tmp_path / "none") == 8000000 * 1024
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("73741824\n")
    assert host.available_memory(meminfo, tmp_path) == 10**9
    assert host.available_memory(tmp_path / "none", tmp_path / "none") is None


def test_the_cache_size_is_read_from_sysfs(tmp_path):
    for name, level, size in (("index0", "1", "48K"), ("index2", "2", "1024K"),
                              ("index3", "3", "32768K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert host.l3_bytes(tmp_path) == 32 * 2**20
    (tmp_path / "index3" / "size").write_text("4M\n")
    assert host.l3_bytes(tmp_path) == 4 * 2**20
    assert host.l3_bytes(tmp_path / "missing") == 0  # then SMALL_WEIGHTS_FALLBACK


def test_generation_stops_in_the_loop_at_the_end_token(tiny_config, tiny_params):
    """The end token is a later token (not the first), in one row of two: that row ends
    there, the other runs on; with a single row the loop itself stops (no more steps)."""
    prompts = [[1, 2, 3], [7, 8]]
    free = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=100,
                           temperature=1.0, seed=3)
    k = next(k for k in range(5, 100) if free[0][k] not in free[0][:k]
             and free[0][k] not in free[1])
    eos = free[0][k]
    cut = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=100,
                          temperature=1.0, seed=3, eos_id=eos)
    assert cut == [free[0][:k], free[1]]
    steps = []
    alone = decode.generate(tiny_config, tiny_params, prompts[:1], max_new_tokens=100,
                            temperature=1.0, seed=3, eos_id=eos,
                            on_tokens=lambda i, tokens_B, done_B: steps.append(i))
    assert alone == [free[0][:k]] and steps == list(range(k + 1))


def test_on_tokens_can_end_rows_and_the_device_stops_soon_after(tiny_config, tiny_params):
    """A host callback (a stop string found in a row's text) ends that row: its result ends at
    that token, and once every row has ended the loop stops within STREAM_EVERY tokens."""
    prompts = [[1, 2, 3], [7, 8]]
    free = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=300,
                           temperature=1.0, seed=3)
    steps = []

    def end_row_0_at_5_and_row_1_at_9(i, tokens_B, done_B):
        steps.append(i)
        return [i >= 5, i >= 9]
    cut = decode.generate(tiny_config, tiny_params, prompts, max_new_tokens=300,
                          temperature=1.0, seed=3, on_tokens=end_row_0_at_5_and_row_1_at_9)
    assert cut == [free[0][:6], free[1][:10]]
    assert max(steps) < 9 + decode.STREAM_EVERY  # not 300


def test_a_prompt_longer_than_the_context_continues_from_its_last_tokens(tiny_config,
                                                                         tiny_params):
    long_prompt = [(7 * i) % 64 for i in range(150)]
    out = decode.generate(tiny_config, tiny_params, [long_prompt], max_new_tokens=20,
                          temperature=0.0)
    assert out == decode.generate(tiny_config, tiny_params, [long_prompt[-64:]],
                                  max_new_tokens=20, temperature=0.0)


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


@pytest.mark.parametrize("prompts,kwargs,match", [
    ([[]], {}, "prompt 0 is empty"),
    ([], {}, "no prompts"),
    ([[1, 64]], {}, "token id 64"),
    ([[1]], {"max_new_tokens": 0}, "max_new_tokens=0"),
    ([[1]], {"top_p": 0.0}, "top_p=0.0"),
    ([[1]], {"top_p": 1.5}, "top_p=1.5"),
    ([[1]], {"top_k": -1}, "top_k=-1"),
    ([[1]], {"temperature": -0.5}, "temperature=-0.5"),
    ([[1]], {"eos_id": 64}, "eos_id=64"),
    # a JAX key holds 32 bits: 2**32 would be seed 0's text again, 2**64 an OverflowError
    ([[1]], {"seed": 2**32}, "seed=4294967296"),
    ([[1]], {"seed": 2**64}, "seed="),
    ([[1]], {"seed": -1}, "seed=-1"),
    ([[1], [2]], {"groups": 3}, "groups=3: must be from 1 to the 2 prompts"),
    ([[1], [2]], {"groups": 0}, "groups=0"),
    # the device takes these as int32 / float32: past that numpy raised OverflowError
    ([[1]], {"top_k": 2**31}, "top_k=2147483648: must be at most"),
    ([[1]], {"max_new_tokens": 2**31}, "max_new_tokens=2147483648: must be at most"),
    ([[1]], {"temperature": 1e39}, "temperature=1e\\+39: must be at most"),
])
def test_bad_arguments_are_refused_by_name(tiny_config, tiny_params, prompts, kwargs, match):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(decode.GenerationError, match=match):
        decode.generate(tiny_config, tiny_params, prompts, **kwargs)


# The RoPE ring with -m slow, as above.
@pytest.mark.parametrize("variant", [{}, pytest.param(dict(position="rope", sliding_window=16),
                                                      marks=pytest.mark.slow)])
def test_a_long_streamed_generation_runs_in_chunks_and_makes_the_same_tokens(
        tiny_config, tiny_params, variant, monkeypatch):
    """Past CHUNK tokens (here 64, the context) a streamed generation is several device calls
    carrying the cache, the last token and the positions: it streams every step once, in
    order, and makes the tokens one call makes, for both window policies (re-prefill with
    learned positions; the RoPE ring)."""
    from transformer.model.gpt import init_params
    config = dataclasses.replace(tiny_config, **variant)
    params = tiny_params if not variant else init_params(config, jax.random.key(0))
    monkeypatch.setattr(decode, "CHUNK", 16)  # the chunk is then the context, 64
    kwargs = dict(max_new_tokens=300, temperature=1.0, seed=3)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    whole = decode.generate(config, params, prompts, **kwargs)
    calls = []
    for name in ("_program", "_continued"):  # count the device calls
        real = getattr(decode, name)
        monkeypatch.setattr(decode, name, lambda *a, real=real, name=name, **k: (
            calls.append(name), real(*a, **k))[1])
    steps = []
    chunked = decode.generate(config, params, prompts, **kwargs,
                              on_tokens=lambda i, t, d: steps.append(i))
    assert calls == ["_program"] + ["_continued"] * 4  # 64 + 64 + 64 + 64 + 44 tokens
    assert steps == list(range(300))
    assert chunked == whole and len(whole[0]) == 300


def test_on_tokens_ends_rows_of_a_long_streamed_generation_at_its_token(tiny_config,
                                                                         tiny_params,
                                                                         monkeypatch):
    """Past CHUNK tokens too, a row that on_tokens ends (a stop string in its text) ends at
    that token, as in one call: no tokens made after it, no padding after the ones it has."""
    monkeypatch.setattr(decode, "CHUNK", 16)  # the chunk is then the context, 64
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    kwargs = dict(max_new_tokens=300, temperature=1.0, seed=3)
    whole = decode.generate(tiny_config, tiny_params, prompts, **kwargs)
    cut = decode.generate(tiny_config, tiny_params, prompts, **kwargs,
                          on_tokens=lambda i, tokens_B, done_B: [i >= 70, i >= 100])
    assert cut == [whole[0][:71], whole[1][:101]]


def test_a_streamed_request_shorter_than_a_stream_chunk_after_its_prompt(tiny_config):
    """A context just above a prompt bucket (40 slots, a 20-token prompt padded to 32) leaves
    room for 8 tokens: a 5-token request's budget is that room, shorter than STREAM_EVERY;
    streamed, it gives every step once and the tokens of the unstreamed call."""
    from transformer.model.gpt import init_params
    config = dataclasses.replace(tiny_config, max_seq_len=40)
    params = init_params(config, jax.random.key(0))
    prompt = list(range(1, 21))
    assert decode.token_budget(5, 40 - 32) < decode.STREAM_EVERY
    kwargs = dict(max_new_tokens=5, temperature=1.0, seed=1)
    plain = decode.generate(config, params, [prompt], **kwargs)
    steps = []
    streamed = decode.generate(config, params, [prompt], **kwargs,
                               on_tokens=lambda i, tokens_B, done_B: steps.append(i))
    assert streamed == plain and steps == list(range(5))

"""Generation past the context: the cached program computes, step by step, what a model run
from scratch over the policy's window computes (docs/sampling.md, decode.py).

The model here depends strongly on its context (scaled-up weights: a freshly initialised one
gives near-uniform attention and repeats one token whatever the cache holds), and the
checks compare every step's logits, through fill segments, re-prefills and ring wraps. The
last tests plant the bugs such checks exist for and show that the checks fail.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ModelConfig
from transformer.generate import decode, sampling, step
from transformer.model import attention, kvcache
from transformer.model.gpt import GPT, init_params

S = 32
BASE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=S,
                   matmul="plain")  # float32 arithmetic: the checks compare at 1e-4
VARIANTS = {  # name: (config, the policy it must get)
    "learned": (BASE, "reprefill"),
    "rope": (dataclasses.replace(BASE, position="rope"), "reprefill"),
    "learned_window": (dataclasses.replace(BASE, sliding_window=8), "reprefill"),
    "rope_window_gqa": (dataclasses.replace(BASE, position="rope", sliding_window=8,
                                            n_kv_heads=2), "roll"),
}
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3]]
NEW = 3 * S


@functools.lru_cache
def context_model(name):
    """The variant's config and its weights scaled up 4x: sharp attention, large logits."""
    config, _ = VARIANTS[name]
    params = init_params(config, jax.random.key(1))
    scaled = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 4.0 if path[-1].key in ("kernel", "embedding", "pos_embed") else x,
        params)
    return config, scaled


@functools.partial(jax.jit, static_argnums=0)
def _last_logits(config, params, contexts_NT, lengths_N):
    """Each right-padded context from scratch (positions 0..), the logits after its last token."""
    logits_NTV = GPT(config).apply({"params": params}, contexts_NT)
    return logits_NTV[jnp.arange(contexts_NT.shape[0]), lengths_N - 1]


def policy_contexts(config, prompt, generated, P):
    """The context each generated token was drawn from, by the policy's definition (not the
    program's mechanics): token k continues prompt + generated[:k], of which the model sees
    - reprefill: the real tokens from the window start, which moves S - W + 1 slots on
      whenever the next token to store would not fit in S slots (slots count from the
      start of the longest prompt of the batch, P tokens long, this one left-padded to it:
      the padding up to the prompt bucket takes no slot);
    - roll: everything (the model's own sliding window limits what it sees)."""
    text, start = list(prompt) + list(generated), P - len(prompt)
    shift = S - decode.keep_length(S) + 1
    window_start, out = 0, []
    for k in range(len(generated)):
        last_slot = P + k - 1  # the slot of the last token the model has read
        while last_slot - window_start >= S:
            window_start += shift
        seen = text[: len(prompt) + k]
        if decode.window_policy(config) == "reprefill":
            seen = seen[max(window_start - start, 0):]
        out.append(seen)
    return out


def recomputed_logits(config, params, contexts, T=None):
    T = T or max(map(len, contexts))  # a fixed T: one compiled forward for every step
    contexts_NT = np.zeros((len(contexts), T), np.int32)
    for row, context in enumerate(contexts):
        contexts_NT[row, : len(context)] = context
    lengths_N = np.array([len(c) for c in contexts], np.int32)
    return np.asarray(_last_logits(config, params, contexts_NT, lengths_N))


def probed_generate(monkeypatch, config, params, prompts, **kwargs):
    """decode.generate, and the logits every token was drawn from (a probe on the sampler):
    the batch as one program (groups=1), whose probe sees every row at every step."""
    seen, original = [], sampling.sample

    def probed(logits_BV, *args):
        jax.debug.callback(lambda x: seen.append(np.asarray(x)), logits_BV, ordered=True)
        return original(logits_BV, *args)

    with monkeypatch.context() as patch:
        patch.setattr(sampling, "sample", probed)
        jax.clear_caches()  # trace the program again, with the probe
        tokens = decode.generate(config, params, prompts, groups=1, **kwargs)
    jax.clear_caches()
    return tokens, np.stack(seen, axis=1)  # [B, steps, V]


def check_cache_matches_recompute(monkeypatch, config, params, prompts=PROMPTS, new=NEW):
    """Every step's logits equal a from-scratch forward over the policy's context."""
    out, logits_BNV = probed_generate(monkeypatch, config, params, prompts, max_new_tokens=new,
                                      temperature=1.0, seed=0)
    P = min(max(map(len, prompts)), S)  # the longest prompt: its bucket's padding takes no slot
    for b, (prompt, generated) in enumerate(zip(prompts, out)):
        assert len(generated) == new
        contexts = policy_contexts(config, prompt, generated, P)
        expected_NV = recomputed_logits(config, params, contexts)
        np.testing.assert_allclose(logits_BNV[b], expected_NV, atol=2e-3, rtol=1e-4)
    return out


def naive_greedy(config, params, prompt, new, P):
    """One token at a time, each from a from-scratch forward over the policy's context."""
    generated = []
    for _ in range(new):
        contexts = policy_contexts(config, prompt, generated + [0], P)
        longest = S if decode.window_policy(config) == "reprefill" else len(prompt) + new
        logits_V = recomputed_logits(config, params, contexts[-1:], longest)[0]
        generated.append(int(np.argmax(logits_V)))
    return generated


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_gets_its_documented_policy(name):
    config, policy = VARIANTS[name]
    assert decode.window_policy(config) == policy


def test_the_model_here_depends_on_its_context():
    """Else a broken cache could go unseen: an early token must move the last logits."""
    config, params = context_model("learned")
    a = recomputed_logits(config, params, [[1, 2, 3, 4, 5, 6]])
    b = recomputed_logits(config, params, [[9, 2, 3, 4, 5, 6]])
    assert np.abs(a - b).max() > 0.2  # 100x the tolerance of the checks below


# One variant per window policy in the default run (the ones the tests below plant bugs in);
# RoPE without a window and the learned window with -m slow.
@pytest.mark.parametrize("name", [n if n in ("learned", "rope_window_gqa") else
                                  pytest.param(n, marks=pytest.mark.slow) for n in VARIANTS])
def test_cached_logits_equal_recompute_for_three_contexts(monkeypatch, name):
    config, params = context_model(name)
    out = check_cache_matches_recompute(monkeypatch, config, params)
    assert all(len(set(row)) > 10 for row in out)  # the text really varies


@pytest.mark.parametrize("name", ["learned", "rope_window_gqa"])
def test_greedy_equals_naive_recompute_for_three_contexts(name):
    config, params = context_model(name)
    out = decode.generate(config, params, PROMPTS, max_new_tokens=NEW, temperature=0.0)
    P = min(max(map(len, PROMPTS)), S)
    for prompt, tokens in zip(PROMPTS, out):
        assert tokens == naive_greedy(config, params, prompt, NEW, P)


# --- planted bugs: each must make the check fail -------------------------------------------

def _fails(monkeypatch, name, target, attr, planted):
    config, params = context_model(name)
    original = getattr(target, attr)
    with monkeypatch.context() as patch:
        patch.setattr(target, attr, planted(original))
        with pytest.raises(AssertionError):
            check_cache_matches_recompute(monkeypatch, config, params)
    jax.clear_caches()


@pytest.mark.parametrize("name", ["learned", "rope_window_gqa"])
def test_a_mask_that_sees_one_slot_too_far_is_caught(monkeypatch, name):
    _fails(monkeypatch, name, attention, "cache_mask",
           lambda f: lambda start_B, index, *a, **k: f(start_B, index + 1, *a, **k))


@pytest.mark.parametrize("name", ["learned", "rope_window_gqa"])
def test_a_write_to_the_wrong_cache_slot_is_caught(monkeypatch, name):
    _fails(monkeypatch, name, kvcache, "write",
           lambda f: lambda cache, k, v, index: f(cache, k, v, (index + 1) % S))


def test_positions_that_do_not_restart_after_a_reprefill_are_caught(monkeypatch):
    """The bug shows only after the first slide: positions keep counting from the old start."""
    _fails(monkeypatch, "rope", step, "slide_start", lambda f: lambda start_B, shift: start_B)


def test_ring_positions_taken_from_the_slot_are_caught(monkeypatch):
    """The bug shows only once the ring wraps: position = slot, not the token's place."""
    _fails(monkeypatch, "rope_window_gqa", step, "positions",
           lambda f: lambda index, T, start_B: f(index % S, T, start_B))

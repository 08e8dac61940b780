"""One forward pass over a text, no cache: what the model says about tokens it is given.

    lp = token_logprobs(model_config, params, tokens, top=5)   # log p(token t | tokens < t)
    weights_LHTT, logits_TV = attention(model_config, params, tokens)   # compiled, bucketed
    weights_LHTT, logits_TV, layers = look_inside(model_config, params, tokens)  # all sown

`token_logprobs` is how a server scores a text (OpenAI's `echo` + `logprobs`, what evaluation
harnesses ask for): the log-softmax of the model's own logits, computed by the kernels the run
trained with, one compiled program per length bucket (16, 32, ..., the context): tokens are
padded on the right, which a causal model never looks at.

`look_inside` also returns what every attention layer sowed (`apply(...,
mutable=["intermediates"])`, model/gpt.py): the weights `visualize` draws. `attention` is the
same pass compiled once per length bucket (the server's page asks for it on every text, and
an eager pass would compile each op anew for every new length). Both use the einsum kernel
because it forms the weights; the jax kernel never does, and computes the same attention
(tests/test_attention.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import ModelConfig
from transformer.generate.decode import PromptError
from transformer.generate.step import prompt_bucket
from transformer.model import kernels
from transformer.model.gpt import GPT, unstack_layers

MAX_TOP = 5  # OpenAI's limit on `logprobs`: the alternatives per token


class LogProbs(NamedTuple):
    chosen_T: np.ndarray     # [T-1]: log p(tokens[t] | tokens[:t]) for t = 1 .. T-1
    top_ids_TK: np.ndarray   # [T, top]: the likeliest next tokens after tokens[:t+1]
    top_lp_TK: np.ndarray    # [T, top]: their log-probabilities


@functools.partial(jax.jit, static_argnames=("config",))
def _score(params, tokens_1T, *, config: ModelConfig):
    logits_1TV = GPT(config).apply({"params": params}, tokens_1T)
    logp_TV = jax.nn.log_softmax(logits_1TV[0].astype(jnp.float32), axis=-1)
    chosen_T = jnp.take_along_axis(logp_TV[:-1], tokens_1T[0, 1:, None], axis=-1)[:, 0]
    # A vocabulary of fewer than MAX_TOP ids (a char run over three symbols) has fewer
    # alternatives: top_k of MAX_TOP raised, for any `top`, 0 included.
    top_lp_TK, top_ids_TK = jax.lax.top_k(logp_TV, min(MAX_TOP, logp_TV.shape[-1]))
    return chosen_T, top_ids_TK, top_lp_TK


def token_logprobs(config: ModelConfig, params, tokens: list[int], top: int = 0) -> LogProbs:
    """Each token's log-probability given the ones before it (the first has none), and the
    `top` likeliest next tokens at every position (all of them, in a vocabulary of fewer).
    At most max_seq_len tokens, each an id of the vocabulary."""
    T = len(tokens)
    if not 0 < T <= config.max_seq_len:
        raise PromptError(f"{T} tokens to score: give 1 .. {config.max_seq_len} (the context)")
    _check_ids(config, tokens)
    if not 0 <= top <= MAX_TOP:
        raise PromptError(f"top={top}: at most {MAX_TOP} alternatives")
    padded = np.zeros((1, prompt_bucket(T, config.max_seq_len)), np.int32)
    padded[0, :T] = tokens
    chosen, top_ids, top_lp = jax.device_get(_score(params, padded, config=config))
    return LogProbs(chosen[: T - 1], top_ids[:T, :top], top_lp[:T, :top])


def _check_ids(config: ModelConfig, tokens) -> None:
    """An id outside the vocabulary is refused: the embedding lookup would read no row (NaN
    scores from it on, or another row's numbers), and nothing would say so."""
    bad = [t for t in tokens if not 0 <= t < config.vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary [0, {config.vocab_size})")


def _weights_config(model_config: ModelConfig) -> ModelConfig:
    return kernels.forming_weights(dataclasses.replace(model_config, scan_layers=False))


@functools.partial(jax.jit, static_argnames=("config",))
def _attention(params, tokens_1T, *, config: ModelConfig):
    params = unstack_layers(params, config.n_layers)
    logits_1TV, state = GPT(config).apply({"params": params}, tokens_1T,
                                          mutable=["intermediates"])
    weights_LHTT = jnp.stack([state["intermediates"][f"block_{i}"]["attn"]
                              ["attention_weights"][0][0] for i in range(config.n_layers)])
    return weights_LHTT.astype(jnp.float32), logits_1TV[0].astype(jnp.float32)


def attention(model_config: ModelConfig, params, tokens: list[int]):
    """(weights_LHTT, logits_TV) as numpy: every layer's attention weights over `tokens` (at
    most max_seq_len) and the logits after each, from one compiled pass per length bucket.
    Padding on the right changes nothing before it: the mask hides it from every query."""
    T = len(tokens)
    if not 0 < T <= model_config.max_seq_len:
        raise PromptError(f"{T} tokens to look at: give 1 .. {model_config.max_seq_len}")
    _check_ids(model_config, tokens)
    padded = np.zeros((1, prompt_bucket(T, model_config.max_seq_len)), np.int32)
    padded[0, :T] = tokens
    weights, logits = jax.device_get(_attention(params, padded,
                                                config=_weights_config(model_config)))
    return weights[:, :, :T, :T], logits[:T]


def look_inside(model_config: ModelConfig, params, tokens: list[int]):
    """One forward pass that also returns what the blocks sowed.

    Returns (weights_LHTT, logits_TV, intermediates): attention weights per layer (numpy,
    float32), the logits, and the raw per-layer intermediates (queries, keys, values, ...).
    """
    T = len(tokens)
    if not 0 < T <= model_config.max_seq_len:  # past it a learned position is NaN
        raise PromptError(f"{T} tokens to look at: give 1 .. {model_config.max_seq_len}")
    _check_ids(model_config, tokens)
    config = _weights_config(model_config)
    params = unstack_layers(params, config.n_layers)
    tokens_1T = jnp.asarray([tokens], jnp.int32)
    logits_1TV, state = GPT(config).apply({"params": params}, tokens_1T,
                                          mutable=["intermediates"])
    layers = [jax.tree.map(lambda x: np.asarray(x[0])[0] if isinstance(x, tuple) else x,
                           state["intermediates"][f"block_{i}"]["attn"],
                           is_leaf=lambda x: isinstance(x, tuple))
              for i in range(config.n_layers)]
    weights_LHTT = np.stack([layer["attention_weights"] for layer in layers])
    return weights_LHTT, np.asarray(logits_1TV[0]), layers

"""inside.py scores a text with the model's own log-softmax, or refuses it in one line: what a
server's logprobs and an evaluation harness read, which no user can check by eye."""

import dataclasses

import jax
import numpy as np
import pytest

from transformer.generate import inside
from transformer.generate.decode import PromptError
from transformer.model.gpt import GPT, init_params


@pytest.mark.parametrize("call", [
    lambda c, p, t: inside.token_logprobs(c, p, t),
    lambda c, p, t: inside.attention(c, p, t),
    lambda c, p, t: inside.look_inside(c, p, t),
])
def test_an_id_outside_the_vocabulary_is_refused(tiny_config, tiny_params, call):
    """Id 64 of a 64-token vocabulary read no embedding row: NaN scores from it on, no error."""
    with pytest.raises(PromptError, match="token id 64 is outside the vocabulary"):
        call(tiny_config, tiny_params, [1, 64, 2])


def test_a_vocabulary_smaller_than_the_alternatives_scores_every_token(tiny_config):
    """Three ids, fewer than MAX_TOP = 5: token_logprobs raised (top_k of 5 over 3) whatever
    `top` was asked for; the scores are the model's log-softmax, and the alternatives all
    three ids, likeliest first."""
    config = dataclasses.replace(tiny_config, vocab_size=3)
    params = init_params(config, jax.random.key(0))
    tokens = [1, 2, 0, 0, 1]
    logits = np.asarray(GPT(config).apply({"params": params}, np.asarray([tokens])),
                        np.float64)[0]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    lp = inside.token_logprobs(config, params, tokens, top=inside.MAX_TOP)
    np.testing.assert_allclose(lp.chosen_T, logp[np.arange(4), tokens[1:]], atol=1e-5)
    assert lp.top_ids_TK.tolist() == np.argsort(-logp, axis=-1, kind="stable").tolist()
    np.testing.assert_allclose(lp.top_lp_TK, np.sort(logp, axis=-1)[:, ::-1], atol=1e-5)

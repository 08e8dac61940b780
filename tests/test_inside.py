"""inside.py scores a text with the model's own log-softmax, or refuses it in one line: what a
server's logprobs and an evaluation harness read, which no user can check by eye."""

import pytest

from transformer.generate import inside
from transformer.generate.decode import PromptError


@pytest.mark.parametrize("call", [
    lambda c, p, t: inside.token_logprobs(c, p, t),
    lambda c, p, t: inside.attention(c, p, t),
    lambda c, p, t: inside.look_inside(c, p, t),
])
def test_an_id_outside_the_vocabulary_is_refused(tiny_config, tiny_params, call):
    """Id 64 of a 64-token vocabulary read no embedding row: NaN scores from it on, no error."""
    with pytest.raises(PromptError, match="token id 64 is outside the vocabulary"):
        call(tiny_config, tiny_params, [1, 64, 2])

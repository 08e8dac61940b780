"""RoPE: attention scores depend only on relative position."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import rope
from transformer.model.gpt import GPT, init_params


@pytest.mark.parametrize("shift", [1, 7, 300])
def test_rotated_scores_depend_only_on_position_differences(shift):
    q_BHTK = jax.random.normal(jax.random.key(0), (2, 3, 12, 16))
    k_BHTK = jax.random.normal(jax.random.key(1), (2, 3, 12, 16))
    positions_BT = jnp.broadcast_to(jnp.arange(12), (2, 12))

    def scores(pos):
        return jnp.einsum("bhtk,bhsk->bhts", rope.apply(q_BHTK, pos), rope.apply(k_BHTK, pos))

    np.testing.assert_allclose(scores(positions_BT), scores(positions_BT + shift),
                               atol=1e-4, rtol=1e-4)
    # and the rotation does something: scores differ from the unrotated ones
    plain = jnp.einsum("bhtk,bhsk->bhts", q_BHTK, k_BHTK)
    assert not np.allclose(scores(positions_BT), plain, atol=1e-2)


def test_rotation_preserves_norms_and_is_identity_at_position_zero():
    x_BHTK = jax.random.normal(jax.random.key(2), (1, 2, 5, 8))
    rotated = rope.apply(x_BHTK, jnp.arange(5)[None] * 13)
    np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1),
                               jnp.linalg.norm(x_BHTK, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(rope.apply(x_BHTK, jnp.zeros((1, 5), jnp.int32)), x_BHTK)


def test_a_rope_model_is_blind_to_a_shift_of_all_positions(tiny_config):
    """No learned position table: shifting every position by k changes neither the attention
    weights nor the logits."""
    config = dataclasses.replace(tiny_config, position="rope")
    params = init_params(config, jax.random.key(0))
    tokens_BT = jax.random.randint(jax.random.key(3), (2, 16), 0, config.vocab_size)
    positions_BT = jnp.broadcast_to(jnp.arange(16), (2, 16))

    def run(pos):
        return GPT(config).apply({"params": params}, tokens_BT, pos, mutable=["intermediates"])

    base_logits, base_state = run(positions_BT)
    for shift in (5, 40):
        logits, state = run(positions_BT + shift)
        np.testing.assert_allclose(logits, base_logits, atol=1e-4, rtol=1e-4)
        weights, base_weights = _attention_weights(state), _attention_weights(base_state)
        assert len(weights) == config.n_layers
        for w, b in zip(weights, base_weights):
            np.testing.assert_allclose(w, b, atol=1e-5)


def _attention_weights(state):
    return [w for path, w in jax.tree_util.tree_leaves_with_path(state)
            if "attention_weights" in jax.tree_util.keystr(path)]

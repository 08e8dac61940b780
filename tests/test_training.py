"""Training end to end on synthetic tasks: the mask holds, attention moves information,
and the loop's state (params, optimizer, step, data position) resumes exactly."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import attention, training
from transformer.config import base_config

VOCAB = 16


def _config(corpus, steps):
    c = base_config()
    c.model.update(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32)
    c.data.corpus = corpus
    c.train.update(steps=steps, batch_size=16, lr=3e-3, warmup_steps=20, log_every=25,
                   eval_every=1000, eval_batches=4, ckpt_every=1000)
    c.sample.max_new_tokens = 8
    return c


def _final_val_loss(workdir):
    from transformer.metrics import MetricsLog
    return [m["val_loss"] for m in MetricsLog(workdir).read() if "val_loss" in m][-1]


def _train(config, workdir, stop_at=None):
    return training.train(config, workdir, progress=False, log=lambda s: None, stop_at=stop_at)


def test_random_tokens_cannot_be_predicted_below_ln_vocab(tmp_path):
    _train(_config("random", 150), tmp_path)
    assert _final_val_loss(tmp_path) > math.log(VOCAB) - 0.05


def test_the_random_token_check_would_catch_a_leaking_mask(tmp_path, monkeypatch):
    """The test above can fail: with the future visible, the next token is simply read off."""
    monkeypatch.setattr(attention, "causal_mask",
                        lambda T, window=0: jnp.ones((1, 1, T, T), bool))
    _train(_config("random", 150), tmp_path)
    assert _final_val_loss(tmp_path) < math.log(VOCAB) - 1.0


def test_copy_task_loss_on_the_copied_half_falls_near_zero(tmp_path):
    _train(_config("copy", 200), tmp_path)
    assert _final_val_loss(tmp_path) < 0.1


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    full, _ = _train(_config("copy", 30), tmp_path / "full")
    interrupted, _ = _train(_config("copy", 30), tmp_path / "split", stop_at=10)
    assert int(interrupted.step) == 10
    resumed, _ = _train(_config("copy", 30), tmp_path / "split")
    assert int(resumed.step) == 30
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)

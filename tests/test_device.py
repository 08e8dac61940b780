"""What must hold on whatever device runs the tests; `python -m transformer device_check` runs
these (and the other tests marked `device`) on a GPU or TPU. On a CPU they run as well: the
properties are the same, only the mesh is smaller."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, ModelConfig, base_config, validate
from transformer.data import batches
from transformer.model import attention
from transformer.model.gpt import GPT, init_params
from transformer.parallel import sharding
from transformer.train.resolve import resolve
from transformer.train.trainer import Trainer

pytestmark = pytest.mark.device

V = 16


def _config(**model):
    c = base_config()
    c.model.update(vocab_size=V, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32,
                   **model)
    c.data.corpus = "copy"
    c.sample.max_new_tokens = 8
    c.train.update(steps=40, batch_size=8 * jax.device_count(), lr=3e-3, warmup_steps=5)
    return validate(c)


def _losses(trainer, steps, source):
    state, losses = trainer.init(0), []
    for i in range(steps):
        state, metrics = trainer.step_fn(state, trainer.batch(source, 0, "train", i))
        losses.append(float(metrics["train_loss"]))
    return state, losses


def test_bfloat16_training_steps_track_float32():
    """Mixed precision on this device (bfloat16 compute, float32 parameters and loss): the
    same steps give finite losses that fall and stay within bfloat16 rounding of float32's."""
    source = batches.CopyTask(V, 32)
    state, bf16 = _losses(Trainer.build(_config(dtype="bfloat16")), 8, source)
    _, f32 = _losses(Trainer.build(_config(matmul="plain")), 8, source)
    assert np.all(np.isfinite(bf16)) and bf16[-1] < bf16[0]
    np.testing.assert_allclose(bf16, f32, atol=3e-2)
    assert jax.tree.leaves(state.params)[0].dtype == jnp.float32


def test_sharded_steps_match_one_device_over_the_real_devices():
    """The batch split over every device of this machine (data axis) gives the losses and
    parameters of the same steps on one device: sharding changes placement, not arithmetic.
    With one device the mesh is trivial; on a multi-GPU host it is the real check."""
    config = _config(matmul="plain")
    source = batches.CopyTask(V, config.model.max_seq_len)
    all_devices = Trainer.build(config, sharding.make_mesh(config.mesh))
    one_device = Trainer.build(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
    state_n, losses_n = _losses(all_devices, 3, source)
    state_1, losses_1 = _losses(one_device, 3, source)
    np.testing.assert_allclose(losses_n, losses_1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state_n.params), jax.tree.leaves(state_1.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_cudnn_attention_is_asked_for_only_by_its_name(monkeypatch):
    """`attention_kernel=jax` lets XLA build the attention; `cudnn` asks jax for cuDNN's
    flash attention in training (decoding keeps XLA's). Recorded at the jax call."""
    asked = {}
    original = jax.nn.dot_product_attention

    def recording(*args, implementation=None, **kwargs):
        asked.setdefault(kernel, set()).add(implementation)
        here = implementation if jax.default_backend() == "gpu" else None
        return original(*args, implementation=here, **kwargs)

    monkeypatch.setattr(attention.jax.nn, "dot_product_attention", recording)
    tokens_BT = jnp.arange(2 * 16).reshape(2, 16) % V
    for kernel in ("jax", "cudnn"):
        config = ModelConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=4, d_ff=64,
                             max_seq_len=16, dtype="bfloat16", attention_kernel=kernel)
        params = init_params(config, jax.random.key(0))
        GPT(config).apply({"params": params}, tokens_BT)
    assert asked == {"jax": {None}, "cudnn": {"cudnn"}}


def test_cudnn_attention_agrees_with_the_reference_or_is_refused_off_gpu():
    """On a GPU, cuDNN flash attention gives the einsum reference's logits (to bfloat16
    rounding). Elsewhere asking for it is one clear error before anything runs."""
    c = base_config()
    c.model.update(vocab_size=V, attention_kernel="cudnn", dtype="bfloat16")
    if jax.default_backend() != "gpu":
        with pytest.raises(ConfigError, match="model.attention_kernel=cudnn: .*GPU"):
            resolve(c)
        return
    config = ModelConfig(vocab_size=V, d_model=64, n_layers=2, n_heads=4, d_ff=128,
                         max_seq_len=64, dtype="bfloat16", matmul="plain")
    params = init_params(config, jax.random.key(0))
    tokens_BT = jax.random.randint(jax.random.key(1), (2, 64), 0, V)
    logits = {k: GPT(dataclasses.replace(config, attention_kernel=k)).apply(
        {"params": params}, tokens_BT) for k in ("einsum", "cudnn")}
    np.testing.assert_allclose(logits["cudnn"], logits["einsum"], atol=5e-2)


def test_cudnn_attention_needs_bfloat16():
    c = base_config()
    c.model.attention_kernel = "cudnn"
    with pytest.raises(ConfigError, match="model.attention_kernel.*bfloat16"):
        validate(c)

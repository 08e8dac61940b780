"""Compiling ahead, from shapes: what a run compiles in threads while it starts (the step, the
evaluation) and while it trains (train.py's end-of-training sample) is the very program the
first real call then runs: that call compiles nothing. A precompile that lowered anything
else (another sharding, dtype or static argument) would compile twice, and fail here."""

import jax
import pytest

from tests.conftest import train_quietly
from tests.test_decode import CompileCounter
from transformer import checkpoint, data
from transformer.config import ModelConfig, base_config
from transformer.generate import text
from transformer.generate.decode import GenerationError
from transformer.model.gpt import init_params
from transformer.parallel import sharding
from transformer.train.trainer import Trainer, evaluate


def _config():
    c = base_config()
    c.model.update(vocab_size=16, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32,
                   position="rope", norm="rmsnorm", mlp="swiglu", matmul="fast_f32")
    c.data.corpus = "copy"
    c.train.update(steps=3, batch_size=8, optimizer="muon", warmup_steps=1, log_every=1,
                   eval_every=2, eval_batches=2, ckpt_every=1000)
    return c


def _compiles(fn) -> int:
    counter = CompileCounter()
    try:
        jax.block_until_ready(fn())
        jax.effects_barrier()
    finally:
        counter.close()
    return counter.count


def test_the_first_step_and_evaluation_find_their_programs_compiled():
    c = _config()
    _, source = data.load(c)
    trainer = Trainer.build(c)
    trainer.precompile(source.batch(0, "train", 0, c.train.batch_size, rows=[0]))
    state = trainer.init(0)
    batch = trainer.batch(source, 0, "train", 0)
    out = []
    assert _compiles(lambda: out.append(trainer.step_fn(state, batch))) == 0
    state, _ = out[0]  # the old state was donated
    assert _compiles(lambda: evaluate(trainer, state.params, source, 0, 2)) == 0
    assert _compiles(lambda: (checkpoint.fingerprint(state.params), checkpoint.fingerprint(
        {"step": state.step, "opt_state": state.opt_state}))) == 0
    # and the check bites: a trainer that was not precompiled compiles its first step
    other = Trainer.build(c)
    fresh = other.init(0)
    assert _compiles(lambda: other.step_fn(fresh, other.batch(source, 0, "train", 0))) >= 1


PROMPT = "\x03\x05\x07"  # the copy task's tokens are bytes below its vocabulary of 16


def test_a_sample_compiled_from_shapes_while_training_compiles_nothing_after(tmp_path):
    """run.train's `alongside` (train.py's use): the sampler's program compiled from the
    state's shapes and shardings while the run trains; sampling the trained params then
    compiles nothing, and gives the text the unsharded sampler (its own program) gives."""
    c = _config()
    mesh = sharding.make_mesh(c.mesh)
    seen = {}

    def alongside(the_run, trainer):
        seen["tokenizer"] = the_run.tokenizer
        text.precompile_sample(ModelConfig.from_config(the_run.config),
                               trainer.abstract_state().params, the_run.tokenizer, PROMPT,
                               max_new_tokens=20, mesh=mesh,
                               rules=sharding.axis_rules(the_run.config))
        seen["done"] = True

    state, the_run = train_quietly(c, tmp_path / "run", mesh, alongside=alongside)
    tokenizer = the_run.tokenizer
    assert seen == {"tokenizer": tokenizer, "done": True}  # it ran, and had ended
    model_config = ModelConfig.from_config(c)
    knobs = dict(max_new_tokens=20, temperature=0.8, top_k=5, seed=3)
    out = []
    assert _compiles(lambda: out.append(text.sample_text(
        model_config, state.params, tokenizer, PROMPT, mesh=mesh,
        rules=sharding.axis_rules(c), **knobs))) == 0
    assert out[0] == text.sample_text(model_config, jax.device_get(state.params), tokenizer,
                                      PROMPT, **knobs)


def test_precompiling_refuses_what_sampling_refuses():
    c = _config()
    model_config = ModelConfig.from_config(c)
    params = jax.eval_shape(lambda: init_params(model_config, jax.random.key(0)))
    tokenizer, _ = data.load(c)
    with pytest.raises(GenerationError, match="empty"):
        text.precompile_sample(model_config, params, tokenizer, "", max_new_tokens=8,
                               mesh=sharding.make_mesh(c.mesh), rules=sharding.axis_rules(c))

"""Sample text from a trained run. The model config and tokenizer come from the checkpoint.

    python sample.py --workdir=runs/tiny --prompt="def " --max_new_tokens=200 \
        --temperature=0.8 --top_k=40 --top_p=0.95 --num_samples=3 --seed=0

--temperature=0 is greedy decoding. All samples are decoded together in one batch.
"""

import jax
from absl import flags

from transformer import checkpoint, cli, config as config_lib, generate
from transformer.config import ModelConfig
from transformer.data import tokenizers
from transformer.model import init_params

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.", required=True)
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate per sample "
                                 "(default: 200, or what the context leaves after the prompt).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0 is greedy; higher is more random.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Keep the smallest set with this much probability.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "How many samples.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
_STOP = flags.DEFINE_string("stop", None, "End a sample at this token (e.g. a newline).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")


def main(argv):
    ckpts = checkpoint.Checkpoints(_WORKDIR.value, read_only=True)
    step = _STEP.value if _STEP.value is not None else ckpts.latest_step()
    if step is None:
        cli.fail(f"{_WORKDIR.value}: no checkpoint yet; train first")
    meta = ckpts.read_meta(step)
    config = config_lib.from_dict(meta["config"])
    model_config = ModelConfig.from_config(config)
    tokenizer = tokenizers.from_json(meta["tokenizer"])
    max_new = _MAX_NEW.value
    if max_new is None:
        max_new = min(200, model_config.max_seq_len - max(1, len(tokenizer.encode(_PROMPT.value))))
    config_lib.check_sampling(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value, max_new,
                              model_config.max_seq_len)
    if _NUM_SAMPLES.value < 1:
        cli.fail(f"num_samples={_NUM_SAMPLES.value}: must be at least 1")
    # Onto one device, whatever mesh wrote the checkpoint: the target names the placement.
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                            jax.eval_shape(lambda: init_params(model_config, jax.random.key(0))))
    params, _ = ckpts.restore(step, abstract)
    texts = generate.sample_text(
        model_config, params, tokenizer, _PROMPT.value, num_samples=_NUM_SAMPLES.value,
        max_new_tokens=max_new, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
        top_p=_TOP_P.value, seed=_SEED.value, stop=_STOP.value)
    for i, text in enumerate(texts):
        print(f"--- sample {i} (step {step}) ---\n{_PROMPT.value}{text}")


if __name__ == "__main__":
    cli.run(main)

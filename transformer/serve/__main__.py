"""Serve a trained run over HTTP: OpenAI's completions API and a page that shows attention.

    python -m transformer serve --workdir=runs/tiny                 http://127.0.0.1:8000/
    python -m transformer serve --hf=path/to/gpt2 --port=8080
    python -m transformer.serve --workdir=runs/tiny                 (the same)

    curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
        -d '{"prompt": "def ", "max_tokens": 40, "temperature": 0.8, "seed": 0}'

Binds 127.0.0.1 unless --host says otherwise. The programs requests run are compiled before
the server answers (`warm up`); `GET /health` answers once it does. docs/serving.md.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from transformer import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.")
_HF = flags.DEFINE_string("hf", None, "Instead of --workdir: a Hugging Face GPT-2 or Llama "
                          "folder (docs/huggingface.md).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest good one).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: every interface; "
                            "there is no authentication).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 256, "The most new tokens one request may ask "
                                   "for (the compiled output buffer).")
_NAME = flags.DEFINE_string("name", None, "The model id clients name (default: the workdir's "
                            "or folder's name).")


def load():
    """(model_config, params, tokenizer, step, default name) of --workdir or --hf."""
    if _HF.value is not None:
        from transformer.hf import load as hf_import
        model_config, params, tokenizer = hf_import.load_pretrained(_HF.value)
        return model_config, params, tokenizer, "hf", Path(_HF.value).resolve().name
    run = load_run(_WORKDIR.value, _STEP.value)
    return (run.model_config, run.params, run.tokenizer, run.step,
            Path(_WORKDIR.value).resolve().name)


def load_run(workdir, step=None):
    """checkpoint.load_run: the run's newest good checkpoint on one device (fingerprints
    checked, a damaged newest one skipped), as sample.py reads it."""
    try:
        from transformer.checkpoint import load_run as the_one_loader  # issue 21's
    except ImportError:
        return _load_run_stand_in(workdir, step)
    return the_one_loader(workdir, step)


def _load_run_stand_in(workdir, step=None):
    # TODO(lead): load_run - a stand-in until issue 21's transformer.checkpoint.load_run is
    # on this branch; delete it at the merge (it imports model/ and train/, which serve/ may
    # not).
    import types

    import jax

    from transformer import config as config_lib
    from transformer.config import ModelConfig
    from transformer.data import tokenizers
    from transformer.model.gpt import init_params  # the stand-in only: load_run's job
    from transformer.model.kernels import auto
    from transformer.train import checkpoint

    def abstract(meta):
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        config = ModelConfig.from_config(config_lib.from_dict(meta["config"]))
        shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                            shapes), None

    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    try:
        found = ckpts.restore_good(abstract, step=step)
    finally:
        ckpts.close()
    config, _ = auto.resolve(config_lib.from_dict(found.meta["config"]))
    return types.SimpleNamespace(step=found.step, config=config,
                                 model_config=ModelConfig.from_config(config),
                                 params=found.params, meta=found.meta,
                                 tokenizer=tokenizers.from_json(found.meta["tokenizer"]))


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    if (_WORKDIR.value is None) == (_HF.value is None):
        cli.fail("give one of --workdir=RUN or --hf=FOLDER")
    if not 1 <= _MAX_TOKENS.value <= 65536:
        cli.fail(f"max_tokens={_MAX_TOKENS.value}: must be in [1, 65536]")
    if not 0 <= _PORT.value <= 65535:
        cli.fail(f"port={_PORT.value}: must be in [0, 65535]")
    if _WORKDIR.value is not None and not Path(_WORKDIR.value).is_dir():
        cli.fail(f"--workdir={_WORKDIR.value}: no such folder; train a run there first")
    import uvicorn

    from transformer.serve.app import create_app
    from transformer.serve.engine import Engine

    model_config, params, tokenizer, step, name = load()
    name = _NAME.value or name
    engine = Engine(model_config, params, tokenizer, max_tokens=_MAX_TOKENS.value)
    print(f"{name} (step {step}): {model_config.n_layers} layers, d_model "
          f"{model_config.d_model}, context {model_config.max_seq_len}; warming up...",
          flush=True)
    print(f"compiled in {engine.warm_up():.1f}s", flush=True)
    app = create_app(engine, name, step)
    print(f"serving on http://{_HOST.value}:{_PORT.value}/  (OpenAI API under /v1)", flush=True)
    try:
        uvicorn.run(app, host=_HOST.value, port=_PORT.value, log_level="warning")
    finally:
        engine.close()


if __name__ == "__main__":
    cli.run(main)

"""Sample text from a trained run. The model config and tokenizer come from the checkpoint.

    python sample.py --workdir=runs/tiny --prompt="def " --max_new_tokens=200 \
        --temperature=0.8 --top_k=40 --top_p=0.95 --num_samples=3 --seed=0

    python sample.py --hf=path/to/gpt2 --prompt="Hello" --temperature=0   # a Hugging Face folder

--temperature=0 is greedy decoding. All samples are decoded together in one batch. Any
--max_new_tokens works: past the model's context, generation goes on from the most recent
tokens (docs/sampling.md). One sample is printed as it is produced; --no_stream prints it
when complete (several samples are always printed when complete).
"""

import sys
from pathlib import Path

from absl import flags

# Only what checks the flags: jax, flax and orbax (~1.5 s to import) come once they are valid,
# so a bad value is refused in a blink (as train.py does).
from transformer import cli
from transformer import config as config_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.")
_HF = flags.DEFINE_string("hf", None, "Instead of --workdir: a Hugging Face GPT-2 folder "
                          "(config.json + model.safetensors; docs/huggingface.md).")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate per sample "
                                 "(any number: the context is not a limit).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0 is greedy; higher is more random.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Keep the smallest set with this much probability.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "How many samples.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
_STOP = flags.DEFINE_multi_string("stop", None, "End a sample before this text (e.g. a "
                                   "newline); repeat for several: the first match ends it.")
_END_AT_EOT = flags.DEFINE_boolean("end_at_eot", True, "End a sample where the model makes "
                                   "the end-of-text token (the end of a document); "
                                   "--noend_at_eot goes on past it (the token is not printed).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --workdir (default: "
                             "the latest).")
_NO_STREAM = flags.DEFINE_boolean("no_stream", False, "Print a sample when it is complete, "
                                  "not as it is produced.")


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    if _NUM_SAMPLES.value < 1:
        cli.fail(f"num_samples={_NUM_SAMPLES.value}: must be at least 1")
    if (_WORKDIR.value is None) == (_HF.value is None):
        cli.fail("give one of --workdir=RUN or --hf=FOLDER")
    for flag, value in (("--workdir", _WORKDIR.value), ("--hf", _HF.value)):
        if value is not None and not value.strip():  # it said ": no checkpoints folder"
            cli.fail(f"{flag} is empty: give a trained run's folder")
    if _HF.value is not None and _STEP.value is not None:
        # A folder holds one set of weights: --step was ignored, its text that of the folder.
        cli.fail(f"--step={_STEP.value} picks a checkpoint of a --workdir run; --hf={_HF.value} "
                 "holds one set of weights: drop --step")
    if _WORKDIR.value is not None and not Path(_WORKDIR.value).is_dir():
        cli.fail(_no_folder(Path(_WORKDIR.value)))
    if not _PROMPT.value:
        cli.fail("--prompt is empty: give at least one character to continue")
    if any(not stop for stop in _STOP.value or []):
        cli.fail("--stop is empty: give the text that ends a sample, e.g. --stop=$'\\n'")
    for name, text in [("--prompt", _PROMPT.value), *(("--stop", s) for s in _STOP.value or [])]:
        cli.check_utf8(name, text)
    config_lib.check_sampling(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value, _MAX_NEW.value)
    from transformer.generate import text as textgen

    step, model_config, params, tokenizer = _load()
    stream = _NUM_SAMPLES.value == 1 and not _NO_STREAM.value
    printer = _StreamPrinter(f"--- sample 0 (step {step}) ---\n{_PROMPT.value}")
    try:
        texts = textgen.sample_text(
            model_config, params, tokenizer, _PROMPT.value, num_samples=_NUM_SAMPLES.value,
            max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
            top_p=_TOP_P.value, seed=_SEED.value, stop=_STOP.value,
            end_at_eot=_END_AT_EOT.value, on_text=printer if stream else None)
    except KeyboardInterrupt:  # a long stream stops between chunks: end its line, exit 130
        if stream:
            printer.close()
        raise
    if stream:
        printer.close()
    else:
        try:
            for i, text in enumerate(texts):
                print(f"--- sample {i} (step {step}) ---\n{_PROMPT.value}{text}")
            sys.stdout.flush()
        except BrokenPipeError:
            printer.gone = True
    if printer.gone:
        _reader_gone()


def _reader_gone():
    """stdout's reader went away (sample.py | head): exit quietly with 128 + SIGPIPE, as
    `yes | head` does. A write to the closed pipe raised BrokenPipeError inside the streaming
    callback: ~60 lines of traceback, and the device generated on. stdout goes to /dev/null
    so that Python's flush at exit has nothing to complain about."""
    import os
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def _no_folder(path: Path) -> str:
    """--workdir names nothing (a typo, often): say so, with the runs that do exist there."""
    if path.exists():
        return f"--workdir={path} is a file, not a run's folder"
    parent = path.parent
    runs = sorted(p.name for p in parent.iterdir() if (p / "checkpoints").is_dir()) \
        if parent.is_dir() else []
    return (f"--workdir={path}: no such folder"
            + (f" ({parent} holds the runs {', '.join(runs)})" if runs else ""))


class _StreamPrinter:
    """Writes the header with the first piece of text (nothing is printed for a prompt that
    turns out to be unusable), then each piece as it comes."""

    def __init__(self, header):
        self.header, self.gone = header, False

    def __call__(self, text):
        """False once stdout's reader has gone (sample_text then ends the sample)."""
        try:
            sys.stdout.write(self.header + text)
            sys.stdout.flush()
        except BrokenPipeError:
            self.gone = True
            return False
        self.header = ""
        return None

    def close(self):
        if self.gone:
            return
        try:
            print(self.header, flush=True)
        except BrokenPipeError:
            self.gone = True


def _load():
    """(step, model config, params, tokenizer) of --hf or of --workdir's checkpoint."""
    if _HF.value is not None:
        from transformer.hf import load as hf_load

        model_config, params, tokenizer = hf_load.load_pretrained(_HF.value)
        if hf_load.tokenizer(_HF.value) is None and model_config.vocab_size > 256:
            cli.fail(f"--hf={_HF.value}: no tokenizer.json and vocab_size="
                     f"{model_config.vocab_size}: ids above 255 have no text without the "
                     "model's own tokenizer; put its tokenizer.json in the folder")
        # The folder's end of sequence (Llama's and Mistral's </s>, not <|endoftext|>) is
        # where --end_at_eot ends a sample, as serve --hf ends a choice there.
        config = hf_load.read_config(_HF.value, f"--hf={_HF.value}")
        # The folder's BOS first, as transformers' tokenizer(prompt) puts it (Llama's <s>).
        tokenizer = hf_load.starting_at(tokenizer, _HF.value)
        return "hf", model_config, params, hf_load.ending_at(tokenizer, _HF.value, config)
    from transformer import checkpoint

    # A damaged newest checkpoint is skipped with a warning; safe while a run trains there.
    run = checkpoint.load_run(_WORKDIR.value, step=_STEP.value)
    return run.step, run.model_config, run.params, run.tokenizer


if __name__ == "__main__":
    cli.run(main)

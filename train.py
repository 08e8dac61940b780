"""Train a GPT on a corpus, save checkpoints, and print a sample at the end.

    python train.py                                   # configs/default.py into runs/default
    python train.py --config=configs/tiny.py --workdir=runs/tiny --config.train.steps=200
    python train.py --config=configs/char_small.py --config.data.corpus=path/to/text.txt

Any config field can be overridden with --config.<section>.<field>=value. Running the same
command again on a workdir that holds a checkpoint resumes from it, exactly; a changed config
is refused unless its fields are named, e.g. --allow_change=train.steps (docs/README-resume.md).
Ctrl-C (or SIGTERM) saves a checkpoint at the current step and stops; Ctrl-C twice quits at once.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from transformer import cli, config as config_lib

_HERE = Path(__file__).resolve().parent
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(_HERE / "configs" / "default.py"), "A config file (Python, get_config()).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go "
                               "(default: runs/<config file name>).")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide the progress bar.")
_ALLOW_CHANGE = flags.DEFINE_list("allow_change", [], "Config fields that may differ from the "
                                  "checkpoint's when resuming, e.g. train.steps,train.lr.")


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    config = cli.config_value(_CONFIG)
    config_lib.validate(config)  # before the ~1.5 s of jax/flax/orbax imports: fails in a blink
    from transformer import generate, training
    workdir = _WORKDIR.value or str(Path("runs") / Path(flags.FLAGS["config"].config_filename).stem)
    state, tokenizer = training.train(config, workdir, progress=not _NO_PROGRESS.value,
                                      allow_change=_ALLOW_CHANGE.value)
    s = config.sample
    try:
        [text] = generate.sample_text(
            training.ModelConfig.from_config(config), state.params, tokenizer, s.prompt,
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
            top_p=s.top_p, seed=config.train.seed)
    except cli.USER_ERRORS as e:
        print(f"(no sample: {e})")
        return
    print(f"\n--- sample (prompt {s.prompt!r}) ---\n{s.prompt}{text}")


if __name__ == "__main__":
    cli.run(main)

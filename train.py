"""Train a GPT on a corpus, save checkpoints, and print a sample at the end.

    python train.py                                   # configs/default.py into runs/default
    python train.py --config=configs/tiny.py --workdir=runs/tiny --config.train.steps=200
    python train.py --config=configs/char_small.py --config.data.corpus=path/to/text.txt

Any config field can be overridden with --config.<section>.<field>=value. Running the same
command again on a workdir that holds a checkpoint resumes from it: bit for bit on the same
mesh; on another mesh the checkpoint restores exactly and training continues correctly, though
not bitwise. A changed config is refused unless its fields are named, e.g.
--allow_change=train.steps. Ctrl-C (or SIGTERM) saves a checkpoint at the current step and
stops (on several processes a signal to one stops all at the same step); Ctrl-C twice quits
at once. A second run on a workdir in use is refused.

Several devices and hosts (docs: "Scaling out"):
    python train.py --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2
    python train.py --coordinator_address=host0:1234 --num_processes=2 --process_id=0   # host 0
    python train.py --coordinator_address=host0:1234 --num_processes=2 --process_id=1   # host 1
    python train.py --distributed        # TPU pods, SLURM: the launcher's environment says it all
"""

import contextlib
import os
import sys
import threading
from pathlib import Path

from absl import flags
from ml_collections import config_flags

# Only what checks the flags and the config: jax, flax and orbax (~1.5 s to import) come in
# main once the config is valid, so a bad value is refused in a blink.
from transformer import cli
from transformer import config as config_lib
from transformer.train import faults, scratch

_HERE = Path(__file__).resolve().parent
try:  # the default file is loaded here, and --config.x.y overrides are applied to it now
    _CONFIG = config_flags.DEFINE_config_file(
        "config", str(_HERE / "configs" / "default.py"), "A config file (Python, get_config()).",
        lock_config=True)
except (KeyError, AttributeError) as e:
    cli.fail(cli.unknown_key(e, sys.argv[1:]))
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go "
                               "(default: runs/<config file name>).")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide the progress bar.")
_ALLOW_CHANGE = flags.DEFINE_list("allow_change", [], "Config fields that may differ from the "
                                  "checkpoint's when resuming, e.g. train.steps,train.lr.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, to train on several hosts.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "How many processes in all.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's number, 0..n-1.")
_JOIN_TIMEOUT = flags.DEFINE_integer("join_timeout", 300, "Seconds a process waits for the "
                                     "others at the coordinator before it gives up.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Join a multi-host run described by "
                                 "the environment (TPU pods, SLURM): jax.distributed.initialize().")


def init_distributed() -> None:
    """Joins the other processes before JAX touches a device (a no-op for one process)."""
    given = [f for f in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID) if f.value is not None]
    if given and len(given) < 3:
        cli.fail("--coordinator_address, --num_processes and --process_id go together; "
                 f"only {', '.join('--' + f.name for f in given)} given")
    if given:
        if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
            cli.fail(f"process_id={_PROCESS_ID.value}: must be in [0, {_NUM_PROCESSES.value - 1}]")
        if _JOIN_TIMEOUT.value <= 0:
            cli.fail(f"--join_timeout={_JOIN_TIMEOUT.value}: must be a positive number of seconds")
        import jax
        where = f"the coordinator {_COORDINATOR.value}"
        print(f"process {_PROCESS_ID.value} of {_NUM_PROCESSES.value}: waiting for the others at "
              f"{where} (giving up after {_JOIN_TIMEOUT.value} s, --join_timeout)", flush=True)
        with _give_up_after(_JOIN_TIMEOUT.value, f"process {_PROCESS_ID.value} of "
                            f"{_NUM_PROCESSES.value}: not every process joined at {where} within "
                            f"{_JOIN_TIMEOUT.value} s; start all {_NUM_PROCESSES.value} with the "
                            "same --coordinator_address and --num_processes"):
            # JAX's own timeout kills the process with a C++ stack trace: ours comes first.
            jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                                       num_processes=_NUM_PROCESSES.value,
                                       process_id=_PROCESS_ID.value,
                                       initialization_timeout=_JOIN_TIMEOUT.value + 60)
    elif _DISTRIBUTED.value:
        import jax
        jax.distributed.initialize()
    if given or _DISTRIBUTED.value:
        _quiet_unless_process_0()


@contextlib.contextmanager
def _give_up_after(seconds: int, message: str):
    """Ends the program with one error line if the block has not finished in `seconds` (a
    process of a multi-process run started alone would otherwise wait in silence)."""
    def give_up():
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(2)  # the waiting call holds the main thread; nothing else can end it
    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _quiet_unless_process_0() -> None:
    """Only process 0 prints (docs/scaling-out.md): the others' standard output, where the
    Gloo collectives library announces its connections, goes nowhere. Errors still show."""
    import jax
    if jax.process_index() != 0:
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    config = config_lib.validate(cli.config_value(_CONFIG))  # touches no device
    scratch.keep_freed_memory()  # glibc keeps each step's scratch for the next (scratch.py)
    init_distributed()
    import jax

    from transformer.generate import text as textgen
    from transformer.parallel import sharding
    from transformer.train import run, start
    if _WORKDIR.value is not None and not _WORKDIR.value.strip():  # it trained in runs/<config>
        cli.fail("--workdir is empty: give a folder (e.g. --workdir=runs/mine), or leave the "
                 "flag out for runs/<the config's name>")
    config_file = flags.FLAGS["config"].config_filename
    workdir = _WORKDIR.value or str(Path("runs") / Path(config_file).stem)
    # A path that is not UTF-8 trained the whole run, then orbax could not name a file in it:
    # a traceback, and no checkpoint.
    cli.check_utf8("--workdir", workdir)

    def sample_args(the_run):  # the config as the run resolved it (vocab_size=0 filled in)
        s = the_run.config.sample
        return dict(model_config=config_lib.ModelConfig.from_config(the_run.config),
                    tokenizer=the_run.tokenizer, prompt=s.prompt,
                    max_new_tokens=s.max_new_tokens, mesh=the_run.mesh,
                    rules=sharding.axis_rules(the_run.config))

    def compile_sampler(the_run, trainer):  # while the run trains: ~3 s less at its end
        try:
            textgen.precompile_sample(params=trainer.abstract_state().params,
                                      **sample_args(the_run))
        except cli.USER_ERRORS:
            pass  # the sample itself says why, after training

    try:  # the config is validated above, before jax was imported: not again
        the_run = start.prepare(config, workdir, allow_change=_ALLOW_CHANGE.value,
                                validated=True)
        state = run.train(the_run, run.Options(
            progress=not _NO_PROGRESS.value, hooks=faults.TestHooks.from_env(),  # tests' kills
            alongside=compile_sampler if config.sample.max_new_tokens else None,
            meta={"config_file": config_file}))  # what a refused resume names (_trained_with)
    except cli.USER_ERRORS as e:  # the default config against a run trained with another
        if flags.FLAGS["config"].present or not (Path(workdir) / "checkpoints").is_dir() \
                or type(e).__name__ == "WorkdirError":  # in use: not a question of config
            raise
        trained_with = _trained_with(workdir)
        if trained_with is None:  # no checkpoint there says its config: the error as it is
            raise
        raise config_lib.ConfigError(f"{e}; train.py without --config uses configs/default.py, "
                                     f"and this run was trained with: {trained_with}"
                                     ) from None
    s = the_run.config.sample
    if not s.max_new_tokens:  # sample.max_new_tokens=0: the run asked for no sample
        return
    try:
        [text] = textgen.sample_text(params=state.params, temperature=s.temperature,
                                     top_k=s.top_k, top_p=s.top_p,
                                     seed=the_run.config.train.seed, **sample_args(the_run))
    except cli.USER_ERRORS as e:
        print(f"(no sample: {e})")
        return
    if jax.process_index() != 0:
        return
    print(f"\n--- sample (prompt {s.prompt!r}) ---\n{s.prompt}{text}")
    from transformer.train import trackers
    trackers.append_text(the_run.workdir, int(state.step), "sample", s.prompt + text)


def _trained_with(workdir) -> str | None:
    """The command line that gives the config saved in `workdir`'s newest readable checkpoint:
    the config file that run was trained with (saved in its meta), plus an override per field
    that differs (free fields aside). None when no checkpoint's meta can be read (all
    damaged)."""
    import shlex

    from transformer import checkpoint
    from transformer.config import files, resume

    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    meta = None
    try:
        for step in reversed(ckpts.all_steps()):
            try:
                meta = ckpts.read_meta(step)
                break
            except Exception:  # noqa: BLE001 -- damaged (the run's error says so): the next
                continue
    finally:
        ckpts.close()
    if meta is None:
        return None
    if "config_file" not in meta:
        return ("a config file its checkpoint does not name (saved before checkpoints named "
                "it): pass that file as --config")
    name = meta["config_file"]
    path = Path(name).resolve() if Path(name).is_file() else _HERE / name
    try:
        config = config_lib.to_dict(config_lib.validate(files.load(path)))
    except Exception:  # noqa: BLE001 -- gone or changed past loading: say so, not why
        return f"--config={name}, which no longer loads"
    diffs = {k: old for k, (old, _) in resume.differences(meta["config"], config).items()
             if k not in resume.FREE}
    overrides = [f"--config.{k}={shlex.quote(str(v))}" for k, v in sorted(diffs.items())]
    return " ".join(["python train.py", f"--config={name}", *overrides, f"--workdir={workdir}"])


if __name__ == "__main__":
    cli.run(main)

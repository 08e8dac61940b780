"""What the command lines share: flag parsing and turning bad input into one clear line.

A user's mistake (a bad flag or config value, a missing corpus, a prompt the tokenizer
cannot encode, a workdir with no checkpoint) ends the program with `error: <what and how to
fix it>` on stderr and exit status 2, never a traceback. Bugs still show their traceback.
A non-finite loss ends it with status 1; SIGINT/SIGTERM, after saving, with 128 + signal.
"""

from __future__ import annotations

import os
import re
import sys

from absl import flags, logging

# Where each kind of user error is declared. cli.py does not import these modules itself
# (jax, flax and orbax take ~1.5 s to import): an error can only come from a module that is
# loaded, so a bad config value is refused before the heavy imports happen at all.
_USER_ERROR_HOMES = {"transformer.config.schema": "ConfigError",
                     "transformer.data.corpus": "CorpusError",
                     "transformer.data.tokenizers": "TokenizerError",
                     "transformer.generate.decode": "GenerationError",
                     "transformer.checkpoint": "CheckpointError",
                     "transformer.train.workdir": "WorkdirError"}


def _loaded(module: str, name: str) -> tuple:
    """(the class `name` of `module`,) if that module is loaded, else (): cli.py imports no
    room of the package, so every room's command line may use it."""
    return (getattr(sys.modules[module], name),) if module in sys.modules else ()


def loaded_user_errors() -> tuple:
    return sum((_loaded(m, name) for m, name in _USER_ERROR_HOMES.items()), ())


def __getattr__(name):  # cli.USER_ERRORS: all of them (imports every module that declares one)
    if name == "USER_ERRORS":
        import importlib
        return tuple(getattr(importlib.import_module(m), n) for m, n in _USER_ERROR_HOMES.items())
    raise AttributeError(name)


def fail(message: str, status: int = 2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def argument_parser(**kwargs):
    """An argparse parser whose mistakes end as every command's do: one `error:` line on
    stderr, status 2 (argparse's own prints its usage first)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            fail(f"{message} (--help lists the arguments)")

    return Parser(**kwargs)


def check_utf8(flag: str, text: str) -> None:
    """Bytes that are not UTF-8 in an argument ($'\\xff', a lone surrogate's
    $'\\xed\\xa0\\x80') reach Python as surrogates that no tokenizer encodes: refused here,
    naming the flag (it was a UnicodeEncodeError traceback)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = text[e.start:e.end].encode("utf-8", "surrogateescape")
        fail(f"{flag} holds bytes that are not UTF-8 text ({raw!r} at character {e.start}): "
             "give it as UTF-8")


def cannot_write(path, folder: bool) -> str | None:
    """Why the file (folder=False) or folder `path` could not be written, or None: checked
    before a command's work, so that a mistyped --out costs nothing. The nearest part of the
    path that exists must be a folder this user may write in."""
    from pathlib import Path
    path = Path(path).absolute()
    if path.exists() and path.is_dir() != folder:
        return f"{path} is {'a file' if folder else 'a folder'}"
    there = next(p for p in (path if folder else path.parent, *path.parents) if p.exists())
    if not there.is_dir():
        return f"{there} is a file, not a folder"
    if not os.access(there, os.W_OK | os.X_OK):
        return f"{there} is not writable"
    return None


def config_value(holder):
    """The value of a config_flags flag; a config file that fails to load is one error line."""
    try:
        value = holder.value
        value.keys()  # a config file that failed to load raises only when used
        return value
    except OSError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        fail("could not load the config: " + (lines[-1] if lines else type(e).__name__))


def unknown_key(error: BaseException, argv) -> str:
    """One line for a --config.x.y (or --sweep.x.y) override naming no field. ml_collections
    raises KeyError("'step'\nDid you mean \"steps\" instead of \"step\"?"); the flag that
    holds the key is found in argv, and the suggestion is put in its place."""
    while error.args and isinstance(error.args[0], BaseException):  # KeyError(KeyError(...))
        error = error.args[0]
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    key = (lines[0] if lines else "").strip("'\"")
    guess = re.search(r'Did you mean "([^"]+)"', text)
    flag = next((name for name in (a.split("=", 1)[0] for a in argv if a.startswith("--"))
                 if key and key in name.lstrip("-").split(".")[1:]), None)
    where = ("(every field: python -m transformer fields; declared in "
             "transformer/config/fields.py)")
    if flag is None:
        return f"unknown config key {key!r}" + (
            f"; did you mean {guess.group(1)!r}?" if guess else "") + f" {where}"
    parts = flag.split(".")
    if guess:
        parts[parts.index(key, 1)] = guess.group(1)
        return f"{flag}: no such config field; did you mean {'.'.join(parts)}? {where}"
    return f"{flag}: no such config field {where}"


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())


def cpu_only_jax() -> None:
    """JAX_PLATFORMS=cpu (unless set) on a machine with no GPU or TPU device file. With libtpu
    installed (the compile and test extras, to build for TPU topologies), JAX tries a TPU at
    start-up and, finding none, prints libtpu's warnings before it falls back to the CPU: a
    command's one-line error would come after five lines of them. A machine with a GPU or
    TPU is left to JAX; a TPU topology still compiles under JAX_PLATFORMS=cpu."""
    from transformer import host
    if "JAX_PLATFORMS" not in os.environ and not host.accelerator_files():
        os.environ["JAX_PLATFORMS"] = "cpu"


# The flags with which absl prints a usage and exits (-h is made --help first).
HELP_FLAGS = ("--help", "-?", "--helpshort", "--helpfull", "--helpxml")


def run(main) -> None:
    """Parses absl flags (including --config and --config.x.y overrides) and calls main(argv)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cpu_only_jax()
    logging.set_verbosity(logging.ERROR)  # orbax and absl chatter; our own output is print()
    from absl import app  # app.run defines --help/--helpfull; we parse flags without it
    app.define_help_flags()
    # -h is --help, as in every other command line (absl knows only --help and -?).
    args = ["--help" if a == "-h" else a for a in sys.argv]
    try:
        argv = flags.FLAGS(args)
    except SystemExit as e:
        # absl prints the usage on stdout and exits 1 for --help; asking for help is no error.
        if e.code == 1 and any(a in HELP_FLAGS for a in args[1:]):
            sys.stdout.flush()
            sys.exit(0)
        raise
    except flags.Error as e:
        fail(_one_line(e))
    except (KeyError, AttributeError) as e:
        fail(unknown_key(e, sys.argv[1:]))
    except (TypeError, ValueError, OSError, SyntaxError) as e:
        fail(f"could not load the config: {_one_line(e)}")
    try:
        main(argv)
    except KeyboardInterrupt:
        fail("interrupted", status=130)
    except Exception as e:  # noqa: BLE001 -- re-raised (with its traceback) unless known
        if isinstance(e, _loaded("transformer.train.faults", "NonFiniteError")):
            fail(_one_line(e), status=1)  # the run failed, not the input: status 1
        if isinstance(e, _loaded("transformer.train.signals", "Stopped")):
            print(str(e), file=sys.stderr)  # SIGINT/SIGTERM after a checkpoint was saved
            sys.exit(e.status)
        if not isinstance(e, loaded_user_errors()):
            raise
        fail(_one_line(e))

"""Runs many `train.py` / `sample.py` command lines, each in a child forked from this process
once it has imported what they import, so that each pays neither Python's start nor the
~1.5 s of importing jax, flax, optax and orbax again.

    python tests/cli_forks.py COMMANDS.json RESULTS.json

COMMANDS.json is a list of argv lists (["train.py", "--flag", ...], scripts relative to the
repository root); RESULTS.json gets [{"returncode", "stdout", "stderr"}] in the same order.
A child runs the script as `python script args` would, through tests/fork_server.py's `child`
(the suite's other command lines run there: run_path as __main__, sys.argv set, its stdout and
stderr on files of its own, non-daemon threads and atexit functions run at its end); its exit
status is that of SystemExit, or 1 with the traceback on stderr for an uncaught exception, as
Python itself does. Nothing has started
a JAX backend or a thread before the forks (checked), so every child starts as clean as a new
process. tests/test_bad_inputs.py runs its rows through this and a few also as real processes,
which must give the same status and the same stderr.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `python train.py` puts the script's folder, the repository root, first on sys.path; so does
# this process for its children (not tests/, the folder of this script).
sys.path[0] = str(ROOT)

# What train.py and sample.py import before and after their flags are checked.
import absl.app  # noqa: E402, F401
import flax  # noqa: E402, F401
import jax  # noqa: E402, F401
import ml_collections  # noqa: E402, F401
import optax  # noqa: E402, F401
import orbax.checkpoint  # noqa: E402, F401

import transformer.checkpoint  # noqa: E402, F401
import transformer.cli  # noqa: E402, F401
import transformer.config  # noqa: E402, F401
from tests import fork_server  # noqa: E402

PARALLEL = 4


def child(argv: list[str], out: str, err: str) -> None:
    """In the forked child: runs the command line as the fork server's children do (the same
    start, exit and traceback); never returns."""
    fork_server.child({"argv": argv, "cwd": str(ROOT), "env": dict(os.environ), "out": out,
                       "err": err})


def main(commands_path: str, results_path: str) -> None:
    from jax._src import xla_bridge
    assert not xla_bridge._backends, "a backend started before the forks"
    assert threading.active_count() == 1, threading.enumerate()
    commands = json.loads(Path(commands_path).read_text())
    os.chdir(ROOT)
    results: list = [None] * len(commands)
    # A folder of our own, not a TemporaryDirectory: its finalizer is an atexit function, and
    # the children run this process's atexit functions as they exit, as Python does.
    tmp = tempfile.mkdtemp()
    try:
        files = [(f"{tmp}/{i}.out", f"{tmp}/{i}.err") for i in range(len(commands))]
        running: dict[int, int] = {}
        todo = list(range(len(commands)))
        while todo or running:
            while todo and len(running) < PARALLEL:
                i = todo.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(commands[i], *files[i])
                running[pid] = i
            pid, status = os.wait()
            i = running.pop(pid)
            results[i] = {"returncode": os.waitstatus_to_exitcode(status),
                          "stdout": Path(files[i][0]).read_text(errors="replace"),
                          "stderr": Path(files[i][1]).read_text(errors="replace")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])

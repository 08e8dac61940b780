"""A fork server for the suite's command lines: a process that has imported what `train.py`,
`sample.py` and `python -m transformer ...` import (jax, flax, optax, orbax, the package)
and forks one child per command line, so that each pays neither Python's start nor the
~1.3 s of CPU of those imports again (a warm 1-step train.py costs ~3.7 s in all).

    python tests/fork_server.py SOCKET      (started by tests/conftest.py's fork_run)

Each connection on the Unix socket SOCKET is one request, a JSON object {"argv", "cwd",
"env", "out", "err"}: argv as after `python` (["train.py", ...], ["-m", "transformer", ...] or
["-c", code]), the child's whole environment, and two files for its stdout and stderr. The
server forks; the child sets the environment and the folder, opens the files, runs the command
as `python argv...` would (runpy as __main__, sys.argv and sys.path[0] as Python sets them),
waits for its non-daemon threads and runs the atexit functions as Python's own exit does, and
exits with SystemExit's status (1 with the traceback for an uncaught exception). The server
answers the child's pid at once (for a timeout's kill), then its exit status and CPU seconds
when it ends.

Nothing has started a JAX backend or a thread before a fork (checked at start), so every
child starts as clean as a new process. What JAX, XLA and Python read from the environment
only at import or start-up (JAX_*, XLA_FLAGS, PYTHONPATH, ...) is the server's: conftest's
fork_run keeps one server per such environment and sends only commands whose start-up
environment equals its server's; the rest (TRANSFORMER_* hooks, read when a run starts)
travel with each request. tests/test_fork_server.py runs commands both ways and requires the
same status, stdout and stderr.
"""

import json
import os
import runpy
import socket
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

# What the suite's command lines import before they do anything (none starts a backend).
import absl.app  # noqa: E402, F401
import flax  # noqa: E402, F401
import jax  # noqa: E402, F401
import ml_collections  # noqa: E402, F401
import numpy  # noqa: E402, F401
import optax  # noqa: E402, F401
import orbax.checkpoint  # noqa: E402, F401

import transformer.checkpoint  # noqa: E402, F401
import transformer.cli  # noqa: E402, F401
import transformer.config  # noqa: E402, F401
import transformer.generate.decode  # noqa: E402, F401
import transformer.train.loop  # noqa: E402, F401
import transformer.model.gpt  # noqa: E402, F401
import transformer.train.start  # noqa: E402, F401
from tests import processes  # noqa: E402

# The imports' objects frozen before any fork: the children's collector never walks (and so
# never copies) those pages, and runs less often (tests/processes.py).
processes.quiet_gc()


def run_command(argv: list[str]) -> None:
    """As `python *argv` runs it, in this process (the forked child)."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        if sys.version_info >= (3, 13):  # its tracebacks quote the -c source's lines
            import linecache
            linecache.cache["<string>"] = (len(argv[1]), None, argv[1].splitlines(True),
                                           "<string>")
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__",
                                                     "__builtins__": __builtins__})
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


def child(request: dict) -> None:
    """In the forked child: runs the request's command line; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            if path is None:  # stderr to stdout's file
                os.dup2(1, 2)
                continue
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        try:
            try:
                run_command(request["argv"])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException as e:
                # The traceback from the command's own frames, as Python prints it.
                tb = e.__traceback__
                while tb and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)):
                    tb = tb.tb_next
                traceback.print_exception(type(e), e, tb)
                code = 1
            # Python's own exit: wait for non-daemon threads, then the atexit functions.
            threading._shutdown()
            import atexit
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def recv_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def main(path: str) -> None:
    import select
    from jax._src import xla_bridge
    assert not xla_bridge._backends, "a backend started before the forks"
    assert threading.active_count() == 1, threading.enumerate()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client)
    while True:
        ready, _, _ = select.select([server, *running], [], [], 2.0)
        if not ready and os.getppid() != parent:  # the pytest worker is gone
            return
        for fd in ready:
            if fd is server:
                conn, _ = server.accept()
                # The client half-closes after its request.
                request = json.loads(recv_all(conn))
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    server.close()
                    conn.close()
                    for pidfd, (_, other) in running.items():
                        os.close(pidfd)
                        other.close()
                    child(request)
                conn.sendall(f"{pid}\n".encode())
                running[os.pidfd_open(pid)] = (pid, conn)
            else:  # a child ended
                pid, conn = running.pop(fd)
                os.close(fd)
                _, status, usage = os.wait4(pid, 0)
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)} "
                                 f"{usage.ru_utime + usage.ru_stime}\n".encode())
                except OSError:
                    pass  # the client gave up (its timeout) and killed the child
                conn.close()


if __name__ == "__main__":
    main(sys.argv[1])

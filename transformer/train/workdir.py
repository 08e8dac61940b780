"""One training run per workdir at a time: a lock held for as long as the run writes there.

Two runs saving into the same checkpoints folder would delete each other's checkpoints and
interleave their metrics. A run takes `fcntl.flock` on `<workdir>/.lock` before its first
checkpoint write and keeps the file open until it ends. The kernel drops such a lock when
its holder exits, however it exits (SIGKILL, a crash, a lost machine's process table), so a
lock is never stale: the file left behind only says who held it last.

    WorkdirLock(workdir).check_free()   # early, writes nothing: refuses a workdir in use
    check_writable(workdir)             # the first write: creates it, proves it writable
    with WorkdirLock(workdir):          # raises WorkdirError naming the holder if another has it
        ... train ...

On several processes only process 0 takes it (the processes share the workdir, and would
refuse each other) and every process learns whether it got it, so that all stop together.
Readers (sample.py, plots) never lock: checkpoints appear in one atomic rename.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

import jax

from transformer.parallel import processes

NAME = ".lock"


class WorkdirError(ValueError):
    """A workdir a run cannot have: another run holds it, or it cannot be written."""


class WorkdirLock:
    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self._file = None

    def __enter__(self) -> "WorkdirLock":
        self._agree(self._take(keep=True) if jax.process_index() == 0 else "")
        return self

    def check_free(self) -> None:
        """Refuses at once a workdir another run holds, without writing (the lock is taken,
        and dropped, only if its file exists)."""
        exists = (self.workdir / NAME).is_file()
        self._agree(self._take(keep=False) if exists and jax.process_index() == 0 else "")

    def _agree(self, holder: str) -> None:
        if processes.max_over_processes(int(bool(holder))):
            self.release()
            raise WorkdirError(f"--workdir={self.workdir}: another training run is using it "
                               f"({holder or 'see process 0'}); wait for it to end, stop it, "
                               "or give another --workdir")

    def __exit__(self, *exc) -> None:
        self.release()

    def _take(self, keep: bool) -> str:
        """Takes the lock (and keeps it if `keep`); returns '' on success, else who holds it."""
        f = open(self.workdir / NAME, "a+" if keep else "r")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "a process that has not written its name yet"
            f.close()
            return holder
        if not keep:
            f.close()
            return ""
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        self._file = f
        return ""

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the lock
            self._file = None


def check_writable(workdir) -> None:
    """Creates `workdir` if needed and proves a file can be written there (then removes it).
    The first thing a run writes; everything it can check without writing comes before."""
    path = Path(workdir)
    try:
        if path.exists() and not path.is_dir():
            raise WorkdirError(f"--workdir={workdir}: is a file, not a folder; "
                               "give a folder path (it is created if missing)")
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except WorkdirError:
        raise
    except OSError as e:
        raise WorkdirError(f"--workdir={workdir}: cannot write there ({e.strerror or e}); "
                           "give a folder you can write to") from None

"""How the suite's own processes run: one core per xdist worker, jemalloc where the machine has
it, and Python's collector run less often. None of it changes a number a test compares: each
is about CPU time spent on the suite's ~750 s of compiling, tracing and tiny steps
(docs/testing.md, "The processes"). `TRANSFORMER_TEST_AS_IS=1` turns all three off.

- **A core per worker.** With two workers on two cores, each worker's XLA keeps a thread pool
  as wide as the machine, so four busy pools share two cores and spin or wait on each other:
  the same tests took ~7% more CPU, and ~60 s more kernel time, than with each worker (and the
  children it starts) held to a core of its own. `pin_worker` does that in each worker, before
  JAX starts its backend; XLA then sizes its pools for one core. Only where there are at least
  as many cores as workers; a plain `pytest -n 0` is left alone.
- **jemalloc.** XLA's compiler and JAX's tracing allocate and free many small objects, and
  ~12% of a compile-bound test module's CPU was glibc's malloc and free (`perf`); preloaded
  jemalloc made the same module ~10% faster (tcmalloc did not). `preload_jemalloc` puts
  the system's `libjemalloc.so.2` (Debian: `apt-get install libjemalloc2`; `.ci/run` installs
  it) in `LD_PRELOAD` for the processes the session starts (the xdist workers, their command
  lines and servers); where it is missing, the suite runs on glibc as before. The checks of a
  process's own page faults and peak memory run on glibc, as users' processes do
  (`glibc_env`): scratch.py's settings are glibc's.
- **The cyclic collector.** Tracing makes many short-lived containers, and Python's default
  thresholds (700 allocations) start a collection every few hundred of them; `quiet_gc`
  freezes what the imports made and raises the first threshold, as long-lived servers do.
"""

from __future__ import annotations

import gc
import glob
import os
import platform

AS_IS = "TRANSFORMER_TEST_AS_IS"
PINNED: int | None = None  # the core pin_worker held this process to
_JEMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                  "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def as_is() -> bool:
    return bool(os.environ.get(AS_IS))


def pin_worker() -> int | None:
    """Holds this xdist worker (and what it starts) to one core of those it may use: worker
    i to the i-th. The core, or None where it does not pin (not a worker, fewer cores than
    workers, no sched_setaffinity, or TRANSFORMER_TEST_AS_IS)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if as_is() or not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if count < 2 or count > len(cores):
        return None
    global PINNED
    PINNED = cores[int(worker[2:]) % len(cores)]
    os.sched_setaffinity(0, {PINNED})
    return PINNED


def jemalloc() -> str | None:
    """The path of the system's jemalloc (libjemalloc.so.2), or None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    for folder in _JEMALLOC_DIRS:
        found = sorted(glob.glob(os.path.join(folder, "libjemalloc.so.2")))
        if found:
            return found[0]
    return None


def preload_jemalloc() -> str | None:
    """Adds jemalloc to LD_PRELOAD for the processes started from now on (call it in the
    session's first process, before xdist starts its workers). The path, or None."""
    path = None if as_is() else jemalloc()
    if path and path not in os.environ.get("LD_PRELOAD", "").split(":"):
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [os.environ.get("LD_PRELOAD"), path]))
    return path


def glibc_env(env: dict) -> dict:
    """`env` without the jemalloc preload_jemalloc added (a user's own LD_PRELOAD stays)."""
    path = jemalloc()
    kept = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != path]
    out = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    if kept:
        out["LD_PRELOAD"] = ":".join(kept)
    return out


def quiet_gc() -> None:
    """Moves everything alive now out of the collector's view (gc.freeze) and starts a
    young-generation collection every 50,000 allocations instead of 700."""
    if as_is():
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)

"""Shared fixtures: tiny model shapes that compile in a second."""

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from transformer import host  # reads the machine's files only: no JAX starts here

# Compile fast, before anything starts a JAX backend (XLA reads its flags once, at that point).
# The suite checks properties (cached == full, sharded == single, resumed == uninterrupted,
# learned < threshold), not speed, and most of its time is XLA compiling tiny programs. On a
# CPU-only install the LLVM back end therefore runs at -O0 without its expensive passes, and
# element-wise fusions go through XLA's older (elemental) IR emitter rather than its MLIR fusion
# emitters, which cost ~15 ms more per program; each op run eagerly (flax's init, optax's,
# a test's own jnp) is a program of its own. Together 40-50% less CPU for compile-bound tests
# (docs/testing.md). And each program's LLVM module is compiled whole, not split into
# pieces for a thread pool (XLA's default, which pays for itself only on large programs):
# ~9% less CPU for in-process test modules on a 2-vCPU Sapphire Rapids (docs/testing.md).
# -O0's results round differently in the last bits from the default level's
# (float32 params after 5 steps: within 1e-6), so every bitwise property is checked between
# programs of one level, as it must hold at any level. Every
# subprocess a test starts inherits the flags (tests that add XLA flags append to them).
# TRANSFORMER_TEST_FULL_OPT=1 runs the suite at XLA's default level; on a machine with a GPU or
# TPU and its plugin (python -m transformer device_check) it always does. A plugin alone is no
# accelerator: the test extra installs libtpu to compile for TPU topologies on a CPU
# (tests/test_compile.py), and such a machine keeps the fast flags. Only the flags the
# installed jaxlib knows are passed (known_fast_compile_flags below): a newer XLA drops some.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                      " --xla_cpu_use_fusion_emitters=false"
                      " --xla_cpu_parallel_codegen_split_count=1")
_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu")
# A GPU's or TPU's device files (transformer/host.py: NVIDIA's driver, a TPU VM's chips).
_DEVICE_FILES = host.accelerator_files()


def _accelerator_here() -> bool:
    return bool(_DEVICE_FILES) and any(importlib.util.find_spec(p) for p in _PLUGINS)


# No GPU or TPU here: every JAX process of the suite (and each command line it starts, as
# cli.cpu_only_jax does) runs on the CPU without trying libtpu, whose warnings would otherwise
# precede each command's one-line error.
if not _DEVICE_FILES:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")



def _xla_accepts(flags: str) -> subprocess.Popen:
    """A child that starts JAX's CPU backend with `flags`: it exits 0 iff XLA knows them all."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def known_fast_compile_flags() -> str:
    """FAST_COMPILE_FLAGS less those this jaxlib does not know. XLA aborts the process at
    backend start on an unknown flag ("Unknown flag in XLA_FLAGS": jaxlib 0.12 dropped
    --xla_cpu_use_fusion_emitters), so they are tried in child processes, once per jaxlib
    version (the answer is kept in the temp folder; the session's workers inherit it)."""
    import importlib.metadata
    import tempfile
    import zlib
    version = importlib.metadata.version("jaxlib")
    key = zlib.crc32(f"{sys.executable} {FAST_COMPILE_FLAGS}".encode())
    kept = Path(tempfile.gettempdir()) / f"transformer-test-xla-flags-{version}-{key:08x}"
    if kept.is_file():
        return kept.read_text()
    known = FAST_COMPILE_FLAGS
    if _xla_accepts(known).wait() != 0:
        each = [(flag, _xla_accepts(flag)) for flag in FAST_COMPILE_FLAGS.split()]
        known = " ".join(flag for flag, child in each if child.wait() == 0)
    with contextlib.suppress(OSError):
        kept.write_text(known)
    return known


_FAST_SET = "TRANSFORMER_TEST_FAST_FLAGS"  # the flags this session added (its workers inherit)
if not os.environ.get("TRANSFORMER_TEST_FULL_OPT") and not _accelerator_here():
    if _FAST_SET not in os.environ:
        os.environ[_FAST_SET] = known_fast_compile_flags()
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {os.environ[_FAST_SET]}"
        os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].strip()

# One core per xdist worker, jemalloc for the processes the session starts, a quieter cyclic
# collector (tests/processes.py): the pinning before JAX starts its backend, which sizes
# XLA's thread pools; the preload before xdist starts its workers (this file is imported
# first in the session's own process).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import processes  # noqa: E402

processes.pin_worker()
processes.preload_jemalloc()

import jax  # noqa: E402
import pytest  # noqa: E402

from transformer.config import ModelConfig  # noqa: E402
from transformer.model.gpt import init_params  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Several xdist workers may share one GPU: none may take most of its memory up front, as JAX
# does by default. Set before the first jax call below starts the backend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# On GPUs, float32 matmuls default to TF32 (10-bit mantissa): equality tests (cached decoding
# == the full forward, sharded == one device) compare the logic, so they run at full float32.
if jax.default_backend() == "gpu":
    jax.config.update("jax_default_matmul_precision", "highest")

# A training run on a CPU measures the matmul peak its MFU divides by (21 matmuls of
# 1024^3, ~1 s of CPU): every train.py the suite starts did, ~100 of them. The session
# measures both peaks once, here (xdist workers and every subprocess inherit the variable),
# and train.py takes them as its measurement (transformer/train/faults.py); in-process runs
# find them already measured in their worker. The bench and device_check still measure.
if jax.default_backend() == "cpu" and "TRANSFORMER_TEST_MATMUL_PEAKS" not in os.environ:
    from transformer.train import metrics as _metrics
    os.environ["TRANSFORMER_TEST_MATMUL_PEAKS"] = ",".join(
        f"{dtype}={_metrics.measure_matmul_peak(dtype):.6g}" for dtype in ("float32", "bfloat16"))


# The modules whose tests take longest in all (wall seconds of one worker in the default run,
# from its per-test timeline on a 2-vCPU Zen 4 under load, after the long checks moved to
# -m slow: every module over ~15 s there; docs/testing.md), longest first. `--dist loadscope`
# hands each worker a whole module at a time, in collection order (`--no-loadscope-reorder` in
# the addopts; by default xdist orders modules by their number of tests, which sent the
# one-test test_bad_inputs.py and the three-test test_device_check.py last): the longest start
# first and the short ones fill the end, so no worker is left with a long module while the
# other idles. (Wall, not CPU: the server modules wait on their servers' start-up, test_textgen
# on a sample, more than they compute, and the last of them set the run's tail.)
SLOWEST_MODULES = (
    "test_training", "test_decode", "test_variants", "test_serve_batching", "test_hf",
    "test_window", "test_sharding", "test_scaling", "test_bench", "test_compile", "test_cli",
    "test_serve_chat", "test_textgen", "test_resume", "test_serve", "test_visualize",
    "test_optimizer", "test_width_lr", "test_serve_hostile", "test_model", "test_kernels",
    "test_precompile", "test_device_check", "test_device", "test_flops")


def pytest_collection_modifyitems(config, items):
    """Modules in SLOWEST_MODULES order first, then the rest as collected; a module's own
    tests keep their order (a stable sort)."""
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent compilation cache for this session: for this process (a test that builds
    the same trainer twice, as resuming does, compiles it once) and for every command-line
    subprocess (train.py, sample.py, the bench, the sharding and multi-process checks), so a
    program that many of them build compiles once. It lives in this session's pytest temp
    folder (shared by xdist workers, removed as pytest rotates them). It changes no numbers
    (a cached executable is the one XLA compiled) and no compile counts (JAX reports a cache
    hit as a compilation, with its time)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-cache"
    cache.mkdir(exist_ok=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=str(cache),
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cc.reset_cache()  # in case something compiled (uncached) before this fixture
    return cache


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """One data cache (cache.py: text corpora named directly, prepared on first use) for this
    session, shared by xdist workers and subprocesses like the compilation cache: a corpus
    many tests train on is prepared once, and nothing is written to the user's ~/.cache."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "data-cache"
    cache.mkdir(exist_ok=True)
    os.environ["TRANSFORMER_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    # The float32 reference arithmetic, so that equalities (cached == full, sharded == single)
    # hold to 1e-5; test_kernels ties the fast modes (what auto runs on a CPU) to it.
    return ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64,
                       matmul="plain")


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
    return init_params(tiny_config, jax.random.key(0))


def shared_dir(tmp_path_factory, name: str, make) -> Path:
    """The folder `name` in this session's temp folder shared by all xdist workers, made once
    by `make(folder)` under a file lock: the first worker to ask makes it, the others wait and
    reuse it. For things many modules only read (a tiny trained run the servers load): each
    module's tests state a property of serving or sampling a trained run, not of its being
    trained for them alone. A folder `make` failed to finish is made again by the next one."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if folder.exists():
                import shutil
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            make(folder)
            done.touch()
    return folder


def train_quietly(config, workdir, mesh=None, allow_change=(), **options):
    """A run as a test trains it: start.prepare, then run.train with no log and no progress
    bar unless `options` (run.Options' fields) say otherwise. Returns (the state after its
    last step, the Run: its tokenizer, mesh and config as the run resolved them)."""
    from transformer.train import run, start
    the_run = start.prepare(config, workdir, mesh, allow_change)
    options = {"log": lambda _: None, "progress": False, **options}
    return run.train(the_run, run.Options(**options)), the_run


@contextlib.contextmanager
def one_trainer_per_config(built: dict):
    """Inside the block, run.train (and so a sweep's members) builds its Trainer once per
    config and mesh: a later run of the same config, or of one differing only in
    `train.seed`, takes the Trainer built first (with its own config: the loop reads the
    seed and the logging fields from it), whose step and evaluation jit's cache then hands
    over. Building traces the step, evaluation and init, ~1 s of CPU for a tiny model even
    with every program in the compilation cache. The step and evaluation read no seed (the
    seed picks the initial params and the batches, both outside them); a run whose config
    differs in any other field, train.profile included, builds its own. For tests whose
    property is about the loop, the data or the sweep around one compiled step (a resumed
    run equals an uninterrupted one, seeds pair up), not about building it."""
    import dataclasses
    import json

    from transformer import config as config_lib
    from transformer.train import run
    real = run.Trainer

    class Shared(real):
        @classmethod
        def build(cls, config, mesh=None):
            fields = config_lib.to_dict(config)
            fields["train"] = {k: v for k, v in fields["train"].items() if k != "seed"}
            key = (json.dumps(fields, sort_keys=True, default=str), mesh)
            if key not in built:
                built[key] = real.build(config, mesh)
            return dataclasses.replace(built[key], config=config)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "Trainer", Shared)
        yield


@pytest.fixture(scope="module")
def module_trainers() -> dict:
    """This module's Trainers by config, for one_trainer_per_config (one dict per module: a
    module that patches the model builds its own)."""
    return {}


@pytest.fixture
def shared_trainers(module_trainers):
    """The test's runs share their module's Trainers of one config (one_trainer_per_config)."""
    with one_trainer_per_config(module_trainers):
        yield


def simulated_devices_env(devices: int, **extra) -> dict:
    """The environment of a subprocess that sees `devices` CPU devices (sharding, several
    processes): this session's XLA flags (the fast-compile ones above, if set) plus the device
    count, the repo on PYTHONPATH (for tests/*_check.py scripts), unbuffered output, `extra`."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                   f"--xla_force_host_platform_device_count={devices}"]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "XLA_FLAGS": flags,
            **extra}


def free_port() -> int:
    """A localhost port nobody listens on now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args, cwd=ROOT, timeout=300, env=None, fork=True):
    """Runs `python <args>` from the repo root; returns the CompletedProcess (text output).
    Through fork_run below (a child of the fork server, not a new Python) unless fork=False:
    a check of the process itself (its page faults, its peak memory) runs in a new one."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if not fork:  # as users' processes run: on glibc's malloc (tests/processes.py)
        return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, env=processes.glibc_env(full_env))
    return fork_run(*args, cwd=cwd, timeout=timeout, env=full_env)


# Environment variables a command reads only once it runs: the test hooks, the data cache, and
# XLA_FLAGS, which XLA parses when the first backend starts, in the child (tests/
# test_fork_server.py checks a device count set there). They travel with each fork_run request.
# So do two that a worker's own imports set mid-session, for modules no fork server imports
# (tensorboardX's CRC32C_SW_MODE, torch inductor's TORCHINDUCTOR_CACHE_DIR): as start-up
# variables they started a second server per worker, ~2 s of CPU each, whose imports were the
# first one's. Every other variable may be read at import or start-up by Python or JAX (JAX_*,
# PYTHONPATH, TF_CPP_MIN_LOG_LEVEL), so a fork server is started per distinct set of them.
_RUNTIME_ENV = ("TRANSFORMER_", "XLA_FLAGS", "PYTEST_CURRENT_TEST", "PYTHONUNBUFFERED",
                "CRC32C_SW_MODE", "TORCHINDUCTOR_CACHE_DIR")
# Kept in one place even where this file is imported twice (as `conftest` and `tests.conftest`).
_FORK_STATE = sys.modules.setdefault("_fork_run_state", type(sys)("_fork_run_state"))
_FORK_SERVERS: dict = _FORK_STATE.__dict__.setdefault("servers", {})
_FORK_LOCK = _FORK_STATE.__dict__.setdefault("lock", threading.Lock())
# CPU seconds of this process's fork_run children (not in its own rusage: the server's)
FORK_CPU: list = _FORK_STATE.__dict__.setdefault("cpu", [0.0])


def _fork_server(startup_env: dict) -> str:
    """The socket of this process's fork server for `startup_env` (tests/fork_server.py),
    started on first use; it exits with this process."""
    key = tuple(sorted(startup_env.items()))
    with _FORK_LOCK:  # test threads may start commands together (test_bad_inputs.py)
        return _FORK_SERVERS[key] if key in _FORK_SERVERS else _start_fork_server(key, startup_env)


def _start_fork_server(key: tuple, startup_env: dict) -> str:
    """Starts a fork server for `startup_env` (under _FORK_LOCK); its socket."""
    import atexit
    import tempfile
    folder = tempfile.mkdtemp(prefix="fork-")
    sock = os.path.join(folder, "s")
    as_is = {processes.AS_IS: "1"} if processes.as_is() else {}  # the server's own settings
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fork_server.py"), sock],
                            cwd=ROOT, env={**startup_env, **as_is}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", "the fork server did not start"
    if "procs" not in _FORK_STATE.__dict__:
        _FORK_STATE.procs = []
        atexit.register(stop_fork_servers)
    proc.folder = folder
    _FORK_STATE.procs.append(proc)
    _FORK_SERVERS[key] = sock
    return _FORK_SERVERS[key]


class ForkedProcess:
    """A command line (`python <args>`: a script, `-m module` or `-c code`) running in a child
    of a fork server (tests/fork_server.py): a process that has already imported jax, flax,
    optax, orbax and the package, so the child starts without Python's start-up or those
    imports (~1.3 s of CPU each). What a test does with a subprocess.Popen it may do with this:
    poll, wait, communicate, send_signal, terminate and kill reach the real child (`pid`);
    its stdout and stderr (stderr_to_stdout: one file) are files, read once it has ended, so
    a test that reads a command's output while it runs starts a real subprocess. `env` is the
    child's whole environment (default os.environ)."""

    def __init__(self, args, cwd=ROOT, env=None, stderr_to_stdout=False):
        import json
        import tempfile
        self.args = [sys.executable, *map(str, args)]
        env = dict(os.environ if env is None else env)
        startup = {k: v for k, v in env.items() if not k.startswith(_RUNTIME_ENV)}
        self._tmp = tempfile.TemporaryDirectory()
        self._out = os.path.join(self._tmp.name, "out")
        self._err = None if stderr_to_stdout else os.path.join(self._tmp.name, "err")
        request = {"argv": self.args[1:], "cwd": str(cwd), "env": env, "out": self._out,
                   "err": self._err}
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_fork_server(startup))
        self._conn.sendall(json.dumps(request).encode())
        self._conn.shutdown(socket.SHUT_WR)
        self._reply = b""
        self.pid = int(self._read_line(None))
        self.returncode = None

    def _read_line(self, timeout):
        """The server's next line; None if `timeout` (0: poll) passes first."""
        import select
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._reply:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return None
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the fork server closed the connection")
            self._reply += chunk
        line, self._reply = self._reply.split(b"\n", 1)
        return line.decode()

    def poll(self, timeout=0):
        if self.returncode is None:
            line = self._read_line(timeout)
            if line is not None:
                code, cpu = line.split()
                self.returncode = int(code)
                FORK_CPU[0] += float(cpu)
                self._conn.close()
        return self.returncode

    def wait(self, timeout=None):
        if self.poll(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def output(self):
        """(stdout, stderr) as text, once the child has ended; stderr None if merged."""
        def read(path):
            return Path(path).read_text(errors="replace") if os.path.exists(path) else ""
        return read(self._out), None if self._err is None else read(self._err)

    def communicate(self, timeout=None):
        self.wait(timeout)
        return self.output()

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        import signal
        self.send_signal(signal.SIGTERM)

    def kill(self):
        import signal
        self.send_signal(signal.SIGKILL)

    def __del__(self):
        if getattr(self, "_tmp", None) is not None:
            self._tmp.cleanup()


def stop_fork_servers() -> None:
    """Ends this process's fork servers and waits for them, so that their CPU time (and their
    children's) counts in this process's, as a subprocess's does: at the session's end (an
    xdist worker may leave without running atexit) or at exit."""
    import shutil
    for proc in _FORK_STATE.__dict__.get("procs", []):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(proc.folder, ignore_errors=True)
    _FORK_STATE.__dict__["procs"] = []
    _FORK_SERVERS.clear()


def pytest_sessionfinish(session, exitstatus):
    stop_fork_servers()


def fork_popen(args, cwd=ROOT, env=None, stderr_to_stdout=False):
    """A ForkedProcess (above) for a command the test signals or polls; a real
    subprocess.Popen (text pipes) under TRANSFORMER_TEST_REAL_PROCESSES=1."""
    if os.environ.get("TRANSFORMER_TEST_REAL_PROCESSES"):
        return subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE)
    return ForkedProcess(args, cwd=cwd, env=env, stderr_to_stdout=stderr_to_stdout)


@contextlib.contextmanager
def reaped(procs):
    """Yields procs; whichever of them still runs when the block ends (a failed assertion, a
    timeout) is killed and waited for, so no test leaves a process behind."""
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def fork_run(*args, cwd=ROOT, timeout=300, env=None) -> subprocess.CompletedProcess:
    """Runs `python <args>` and waits, as subprocess.run(capture_output=True, text=True) does,
    in a ForkedProcess (above): ~1.3 s of CPU less than a new Python. A command that the test
    signals, reads while it runs or joins to others (jax.distributed) is a real subprocess.
    TRANSFORMER_TEST_REAL_PROCESSES=1 runs every one as a real process."""
    if os.environ.get("TRANSFORMER_TEST_REAL_PROCESSES"):
        return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, env=env)
    proc = ForkedProcess(args, cwd=cwd, env=env)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, *proc.output())


# What the imports above made is long-lived: out of the cyclic collector's view from here on,
# which runs less often (tests/processes.py).
processes.quiet_gc()

"""Shared fixtures: tiny model shapes that compile in a second."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

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
# TRANSFORMER_TEST_FULL_OPT=1 runs the suite at XLA's default level; with a CUDA or TPU
# plugin installed (python -m transformer device_check on an accelerator) it always does.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                      " --xla_cpu_use_fusion_emitters=false"
                      " --xla_cpu_parallel_codegen_split_count=1")
_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu")
if not os.environ.get("TRANSFORMER_TEST_FULL_OPT") and not any(
        importlib.util.find_spec(name) for name in _ACCELERATOR_PLUGINS):
    flags = os.environ.get("XLA_FLAGS", "")
    if FAST_COMPILE_FLAGS not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_FLAGS}".strip()

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


# The modules whose tests take longest in all (seconds of one worker, measured 2026-12-02 on a
# 2-vCPU Sapphire Rapids, docs/testing.md), longest first. `--dist loadscope` hands each worker
# a whole module at a time, in collection order (`--no-loadscope-reorder` in the addopts; by
# default xdist orders modules by their number of tests, which sent the one-test
# test_bad_inputs.py and the three-test test_device_check.py last): the longest start first and
# the short ones fill the end, so no worker is left with a long module while the other idles.
SLOWEST_MODULES = (
    "test_resume", "test_sharding", "test_hf", "test_variants", "test_scaling", "test_decode",
    "test_serve_batching", "test_training", "test_device_check", "test_bench",
    "test_bad_inputs", "test_cli", "test_window", "test_prepare", "test_serve",
    "test_optimizer", "test_width_lr", "test_multihost", "test_visualize", "test_trackers")


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


def run_cli(*args, cwd=ROOT, timeout=300, env=None):
    """Runs `python <args>` from the repo root; returns the CompletedProcess (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)

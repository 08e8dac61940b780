"""Shared fixtures: tiny model shapes that compile in a second."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from transformer.config import ModelConfig
from transformer.model import init_params

ROOT = Path(__file__).resolve().parent.parent

# Several xdist workers may share one GPU: none may take most of its memory up front, as JAX
# does by default. Set before the first jax call below starts the backend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# On GPUs, float32 matmuls default to TF32 (10-bit mantissa): equality tests (cached decoding
# == the full forward, sharded == one device) compare the logic, so they run at full float32.
if jax.default_backend() == "gpu":
    jax.config.update("jax_default_matmul_precision", "highest")


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


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    # The float32 reference arithmetic, so that equalities (cached == full, sharded == single)
    # hold to 1e-5; test_kernels ties the fast modes (what auto runs on a CPU) to it.
    return ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64,
                       matmul="plain")


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
    return init_params(tiny_config, jax.random.key(0))


def run_cli(*args, cwd=ROOT, timeout=300, env=None):
    """Runs `python <args>` from the repo root; returns the CompletedProcess (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)

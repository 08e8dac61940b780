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

# On GPUs, float32 matmuls default to TF32 (10-bit mantissa): equality tests (cached decoding
# == the full forward, sharded == one device) compare the logic, so they run at full float32.
if jax.default_backend() == "gpu":
    jax.config.update("jax_default_matmul_precision", "highest")


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

"""A program built for a target must not depend on the host that builds it: one (config,
target) compiled under different host conditions (an ISA cap, a different number of simulated
host devices, JAX_PLATFORMS set and unset, a patched CPU description) gives the same
optimised HLO, metadata stripped (tools/program.py). The check fails on a planted host read:
`model.matmul=auto` resolved by the building machine's CPU. Each condition is a fresh process
(tests/host_independence_check.py): host facts are read once per process.

The fingerprint of the tiny config's train step on v5e:2x2 (fsdp 4) is kept in
tests/fingerprints.json beside the versions that built it, so a change to the program shows
in review; under other versions the comparison is skipped, and the file says how to refresh.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINGERPRINTS = os.path.join(ROOT, "tests", "fingerprints.json")
CONDITIONS = {  # name: (environment changes, arguments)
    "as is": ({}, []),
    "ISA capped at AVX2": ({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}, []),
    "8 simulated host devices": ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, []),
    "JAX_PLATFORMS=cpu": ({"JAX_PLATFORMS": "cpu"}, []),
    "an AVX2-only CPU": ({}, ["--cpu=avx2"]),
    "an AMX CPU": ({}, ["--cpu=amx"]),
}


def build(target: str, tmp_path, env_changes: dict, args: list, python=sys.executable) -> dict:
    out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(env_changes, PYTHONPATH=ROOT)
    r = subprocess.run([python, "tests/host_independence_check.py", target, str(out), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def check(target: str, tmp_path, conditions: dict, python=sys.executable) -> dict:
    built = {name: build(target, tmp_path, env, args, python)
             for name, (env, args) in conditions.items()}
    prints = {name: b["fingerprint"] for name, b in built.items()}
    assert len(set(prints.values())) == 1, prints
    planted = {name: build(target, tmp_path, conditions[name][0], conditions[name][1] +
                           ["--plant"], python) for name in ("as is", "8 simulated host devices")}
    # the planted host read changes the program with the host, and the check sees it
    assert planted["as is"]["fingerprint"] != planted["8 simulated host devices"]["fingerprint"]
    return next(iter(built.values()))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_a_tpu_program_does_not_depend_on_the_host(tmp_path):
    built = check("v5e:2x2", tmp_path, CONDITIONS)
    with open(FINGERPRINTS) as f:
        kept = json.load(f).get("tiny fsdp 4, v5e:2x2")
    assert kept, f"no fingerprint kept: {built['fingerprint']} under {built['built_under']}"
    same = {k: built["built_under"].get(k) for k in kept["built_under"]}
    if same != kept["built_under"]:
        pytest.skip(f"built under {same}, the fingerprint under {kept['built_under']}")
    assert built["fingerprint"] == kept["fingerprint"], (
        "the tiny train step's program changed: if meant, put the new fingerprint "
        f"{built['fingerprint']} in tests/fingerprints.json")


CUDA_PYTHON = os.environ.get("CUDA_PYTHON", "")


@pytest.mark.gpu_compile
@pytest.mark.skipif(not CUDA_PYTHON, reason="set CUDA_PYTHON to a python with jax[cuda12]")
def test_a_gpu_program_does_not_depend_on_the_host(tmp_path):
    """JAX_PLATFORMS=cpu is required for a GPU target without a GPU, so it is set in all."""
    conditions = {k: ({**env, "JAX_PLATFORMS": "cpu"}, args)
                  for k, (env, args) in CONDITIONS.items()}
    check("h100:1x1x4", tmp_path, conditions, python=CUDA_PYTHON)

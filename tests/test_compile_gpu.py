"""The train step compiled for 8 NVIDIA H100s on a machine without a GPU (XLA's deviceless GPU
topologies): the shipped h100 target is one XLA's compiler accepts, the program it builds fits
an H100, splits the weights over fsdp, and `attention_kernel=cudnn` puts cuDNN's fused
attention into it (forward and backward), where einsum attention has none.

Runs where the CUDA plugin is installed (`pip install -e ".[cuda12,test]"`, a venv of its
own: see the marker's note in pyproject.toml for why CI does not), by hand:

    .venv-cuda/bin/python -m pytest -m gpu_compile tests/test_compile_gpu.py

The compile runs in a child process (tests/compile_gpu_check.py) with JAX_PLATFORMS=cpu:
without a GPU the plugin registers its CUDA topologies only when told not to look for one,
which must hold before JAX first looks for its plugins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from transformer.parallel import gpu_targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def needs_plugin(test):
    """The compile tests: marked gpu_compile (left out of the default run), and skipped
    where the plugin is missing."""
    test = pytest.mark.skipif(
        importlib.util.find_spec("jax_cuda12_plugin") is None,
        reason="the CUDA plugin is not installed: pip install -e '.[cuda12]' (a venv of its "
               "own) to compile for GPU targets")(test)
    return pytest.mark.gpu_compile(test)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "report.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "tests/compile_gpu_check.py", str(out)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@needs_plugin
def test_the_h100_target_is_eight_h100s(report):
    assert report["devices"] == 8 and report["platform"] == "gpu"
    assert report["kind"] == gpu_targets.chip("h100").device_kind == "NVIDIA H100 80GB HBM3"


@needs_plugin
def test_every_shipped_target_is_one_xla_accepts(report):
    assert report["targets"] == {name: [8, gpu_targets.chip(name).device_kind]
                                 for name in gpu_targets.names()}


@needs_plugin
def test_the_tiny_step_compiles_for_h100_and_fits(report):
    for kernel in ("einsum", "cudnn"):
        r = report[kernel]
        assert 0 < r["peak_bytes"] < report["hbm_bytes"], kernel
        assert r["all_gathers"] >= 1, kernel  # fsdp 8: the weights are gathered before use


@needs_plugin
def test_cudnn_attention_is_in_the_gpu_program_and_only_when_asked(report):
    assert report["cudnn"]["cudnn_attention"] == ["__cudnn$fmhaSoftmax",
                                                  "__cudnn$fmhaSoftmaxBackward"]
    assert report["einsum"]["cudnn_attention"] == []


def test_target_files_and_facts_ship_with_the_package():
    """The loader reads every shipped target (package data), and refuses an unknown name in
    one line naming the known ones. Needs no plugin: part of the default run."""
    for name in gpu_targets.names():
        text = gpu_targets.config_text(name)
        chip = gpu_targets.chip(name)
        assert 'platform_name: "CUDA"' in text and f'"{chip.device_kind}"' in text
        assert f"device_memory_size: {chip.hbm_bytes}" in text
        assert set(chip.sources) - {"reported_bytes"} == {
            "hbm_bytes", "hbm_bytes_per_s", "peak_bf16_flops", "nvlink_bytes_per_s"}
        assert chip.reported_bytes is None or "reported_bytes" in chip.sources
    with pytest.raises(ValueError, match="known: a100, h100, h200"):
        gpu_targets.config_text("b200")


def test_a_bad_gpu_target_is_one_line_saying_what_to_do():
    """An unknown GPU, a topology not in XLA's form, and (where the plugin is missing) the
    install line: each one line, before JAX is asked for anything."""
    cases = [(("b200",), "unknown; known: a100, h100, h200"),
             (("h100", "8"), "must be <partitions>x<hosts per partition>x<GPUs per host>")]
    if importlib.util.find_spec("jax_cuda12_plugin") is None:
        cases.append((("h100",), "needs the CUDA plugin: pip install 'jax[cuda12]==0.10.2'"))
    for args, words in cases:
        with pytest.raises(ValueError) as error:
            gpu_targets.devices(*args)
        assert words in str(error.value) and "\n" not in str(error.value), args

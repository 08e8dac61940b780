"""parallel/links.py and the roofline's peak and memory (tools/compile.py): each collective
priced on the links its replica group spans, the peak of the precision that runs, the memory
the device reports. Fake devices and targets: no JAX compile, milliseconds."""

import types

import numpy as np
import pytest

from transformer.parallel import links
from transformer.parallel import target as target_lib
from transformer.tools import collectives, compile as compile_tool


def tpu(chip, coords, slices=None):
    devices = [types.SimpleNamespace(coords=c, slice_index=s, process_index=0,
                                     device_kind="TPU v5", platform="tpu")
               for c, s in zip(coords, slices or [0] * len(coords))]
    return devices, types.SimpleNamespace(name=f"{chip}:4x4x4", platform="tpu",
                                          link_bytes_s=1.0)


def gpu(hosts, per_host=8):
    devices = [types.SimpleNamespace(process_index=h, device_kind="NVIDIA H100 80GB HBM3",
                                     platform="gpu") for h in range(hosts) for _ in range(per_host)]
    return devices, types.SimpleNamespace(name=f"h100:1x{hosts}x{per_host}", platform="gpu",
                                          link_bytes_s=450e9)


def op(kind, nbytes, groups):
    return collectives.Op(kind, "x", "", "bf16[1]", nbytes, 1, len(groups[0]), (),
                          np.array(groups))


def test_a_ring_uses_the_ports_of_the_torus_axes_it_spans():
    """v5p: 1200 GB/s both ways over 6 ports, 100 GB/s per port each way: a ring along one
    axis uses 2 ports (200 GB/s), along two axes 4 (400 GB/s); never the chip's whole 600."""
    line = [(i, 0, 0) for i in range(4)]
    devices, target = tpu("v5p", line)
    assert links.link(devices, target)[:2] == ("ici", 200e9)
    square, target = tpu("v5p", [(i, j, 0) for i in range(2) for j in range(2)])
    assert links.link(square, target)[:2] == ("ici", 400e9)
    v5e, target = tpu("v5e", line)
    assert links.link(v5e, target)[:2] == ("ici", 100e9)  # 400 GB/s both ways, 4 ports


def test_an_all_gather_moves_n_minus_1_of_n_of_its_result():
    devices, target = tpu("v5p", [(i, 0, 0) for i in range(4)])
    priced = links.price([op("all-gather", 8e9, [[0, 1, 2, 3]])], devices, target)
    assert priced["networks"]["ici"]["seconds"] == pytest.approx(8e9 * 3 / 4 / 200e9)
    ar = links.price([op("all-reduce", 8e9, [[0, 1, 2, 3]])], devices, target)
    assert ar["seconds"] == pytest.approx(2 * priced["seconds"])


def test_a_group_across_slices_crosses_dcn_with_one_share_per_chip():
    """Two slices of 2 chips: the all-reduce runs inside each slice on ICI and sends half its
    bytes (k = 2 chips per slice) over DCN at v5p's 50 Gb/s per chip."""
    devices, target = tpu("v5p", [(0, 0, 0), (1, 0, 0)] * 2, slices=[0, 0, 1, 1])
    priced = links.price([op("all-reduce", 1e9, [[0, 1, 2, 3]])], devices, target)
    dcn = priced["networks"]["dcn"]
    assert dcn["bytes"] == 1e9 and dcn["sent"] == pytest.approx(2 * 1e9 / 2 * 1 / 2)
    assert dcn["seconds"] == pytest.approx(dcn["sent"] / (50e9 / 8))
    assert "ici" in priced["networks"]  # the slice-local part


def test_gpu_traffic_between_hosts_is_priced_at_the_nic_not_nvlink():
    devices, target = gpu(2)
    inside = links.price([op("all-gather", 1e9, [list(range(8))])], devices, target)
    across = links.price([op("all-gather", 1e9, [list(range(16))])], devices, target)
    assert set(inside["networks"]) == {"nvlink"} and set(across["networks"]) == {"network"}
    assert across["seconds"] / inside["seconds"] == pytest.approx(
        (15 / 16) / 50e9 / ((7 / 8) / 450e9))


def test_the_peak_is_the_precision_that_runs():
    """GPT-2 small in float32 on an H100 runs TF32 (494.7 TF/s), not bf16's 989."""
    devices, target = gpu(1)
    target.devices = devices
    assert compile_tool.peak_of(target, "float32")[0] == 494.7e12
    assert compile_tool.peak_of(target, "bfloat16")[0] == 989e12


def test_fits_is_judged_against_the_memory_the_device_reports():
    assert target_lib.LIBTPU_HBM["v5p"] == 95.74 * 2**30
    h100 = target_lib.Target("h100:1x1x8", "gpu", (None,), 1, 80 * 2**30, 1, 1, 1,
                             84978434048)
    assert h100.memory_bytes == 84978434048  # 79.14 GiB, not the datasheet's 80
    verdict = compile_tool.gpu_memory(int(70 * 2**30), h100.memory_bytes)
    assert not verdict["fits_default"] and "XLA_PYTHON_CLIENT_MEM_FRACTION=0.9" in \
        verdict["advice"] and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in verdict["advice"]
    assert compile_tool.gpu_memory(int(50 * 2**30), h100.memory_bytes)["fits_default"]

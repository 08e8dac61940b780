"""NVIDIA GPUs as compile targets: XLA's description of each chip, and the facts a plan needs.

    text = config_text("h100")              the GpuTargetConfigProto text (h100.txtpb)
    devices("h100", "2x1x8")                abstract H100s: get_topology_desc(platform="cuda",
                                            target_config=text, topology=...).devices
    chip("h100").hbm_bytes, .peak_bf16_flops, .nvlink_bytes_per_s     with .sources

A GPU topology is "<partitions>x<hosts per partition>x<GPUs per host>" (XLA's form);
each device's process_index is its host. Compiling for them needs the CUDA plugin
(`pip install "jax[cuda12]==0.10.2"`) and, on a machine without a GPU, JAX_PLATFORMS=cpu set
before JAX starts (the plugin then skips its driver check; without it the plugin registers
no CUDA topology). The .txtpb files are package data; reading them imports no JAX. Every
number is from NVIDIA's public documents, named in `sources` and in each file's header.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from importlib import resources

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class GpuChip:
    name: str                # the target's name: h100, h200, a100
    device_kind: str         # what a real device (and the compiled topology's) reports
    hbm_bytes: int           # memory per GPU
    hbm_bytes_per_s: float   # memory bandwidth
    peak_bf16_flops: float   # dense bf16 tensor-core FLOP/s (NVIDIA quotes twice this "with
    #                          sparsity"; a transformer's matmuls are dense)
    nvlink_bytes_per_s: float  # NVLink bandwidth per GPU, both directions together as NVIDIA
    #                            quotes it; each direction carries half (what a ring
    #                            all-gather or reduce-scatter moves per GPU per second)
    sources: dict            # field -> the public document it comes from
    reported_bytes: int | None = None  # the memory CUDA reports on a real one (None: unknown)

    @property
    def nvlink_one_way_bytes_per_s(self) -> float:
        return self.nvlink_bytes_per_s / 2


_H100_DS = ("NVIDIA H100 Tensor Core GPU datasheet, SXM column "
            "(https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)")
_H100_WP = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022 "
            "(https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper)")
_XLA_SPECS = ("XLA's gpu_specs/h100_sxm.txtpb, what CudaExecutor::CreateDeviceDescription "
              "reports on an H100 SXM (https://github.com/openxla/xla/tree/main/xla/tools/"
              "hlo_opt/gpu_specs)")
_H200_DS = "NVIDIA H200 datasheet, SXM column (https://www.nvidia.com/en-us/data-center/h200/)"
_A100_DS = ("NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column "
            "(https://www.nvidia.com/en-us/data-center/a100/)")
_A100_WP = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020 (https://images.nvidia"
            ".com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf)")

CHIPS = {
    "h100": GpuChip(
        "h100", "NVIDIA H100 80GB HBM3", hbm_bytes=80 * GIB, hbm_bytes_per_s=3.35e12,
        peak_bf16_flops=989.4e12, nvlink_bytes_per_s=900e9,
        sources={"hbm_bytes": f"80GB HBM3: {_H100_DS}",
                 "hbm_bytes_per_s": f"3.35TB/s: {_H100_DS}",
                 "peak_bf16_flops": f"989.4 dense BF16 TFLOPS (1,979 with sparsity): "
                                    f"{_H100_WP}; {_H100_DS}",
                 "nvlink_bytes_per_s": f"NVLink 900GB/s (18 fourth-generation links): "
                                       f"{_H100_DS}",
                 "reported_bytes": f"device_memory_size 84978434048 (79.14 GiB): "
                                   f"{_XLA_SPECS}"},
        reported_bytes=84978434048),
    "h200": GpuChip(
        "h200", "NVIDIA H200", hbm_bytes=141 * GIB, hbm_bytes_per_s=4.8e12,
        peak_bf16_flops=989.4e12, nvlink_bytes_per_s=900e9,
        sources={"hbm_bytes": f"141GB HBM3e: {_H200_DS}",
                 "hbm_bytes_per_s": f"4.8TB/s: {_H200_DS}",
                 "peak_bf16_flops": f"1,979 BF16 TFLOPS with sparsity, so 989.4 dense (the "
                                    f"H100's die and clocks): {_H200_DS}; {_H100_WP}",
                 "nvlink_bytes_per_s": f"NVLink 900GB/s: {_H200_DS}"}),
    "a100": GpuChip(
        "a100", "NVIDIA A100-SXM4-80GB", hbm_bytes=80 * GIB, hbm_bytes_per_s=2.039e12,
        peak_bf16_flops=312e12, nvlink_bytes_per_s=600e9,
        sources={"hbm_bytes": f"80GB HBM2e: {_A100_DS}",
                 "hbm_bytes_per_s": f"2,039GB/s: {_A100_DS}",
                 "peak_bf16_flops": f"312 dense BF16 TFLOPS (624 with sparsity): {_A100_DS}; "
                                    f"{_A100_WP}",
                 "nvlink_bytes_per_s": f"NVLink 600GB/s (12 third-generation links): "
                                       f"{_A100_DS}"}),
}


def names() -> list[str]:
    return sorted(CHIPS)


def _check(name: str) -> str:
    key = name.lower()
    if key not in CHIPS:
        raise ValueError(f"GPU target {name!r}: unknown; known: {', '.join(names())}")
    return key


def chip(name: str) -> GpuChip:
    """The chip facts of a GPU target by name (h100, h200, a100; any case)."""
    return CHIPS[_check(name)]


def config_text(name: str) -> str:
    """The GpuTargetConfigProto text XLA compiles against for this GPU (the .txtpb file)."""
    return resources.files(__name__).joinpath(f"{_check(name)}.txtpb").read_text()


def devices(name: str, topology: str = "1x1x8") -> list:
    """The abstract devices of `topology` GPUs of this kind, to build a mesh over and compile
    for (nothing runs on them). Raises ValueError, one line saying what to do, for a bad name
    or topology, a missing CUDA plugin, or a plugin that registered no topology."""
    key = _check(name)
    if not re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*", topology):
        raise ValueError(f"GPU topology {topology!r}: must be <partitions>x<hosts per "
                         f"partition>x<GPUs per host>, e.g. {key}:1x1x8 for one host of 8")
    if importlib.util.find_spec("jax_cuda12_plugin") is None:
        raise ValueError(f"compiling for {key} needs the CUDA plugin: pip install "
                         f"'jax[cuda12]==0.10.2' (no GPU needed; run with JAX_PLATFORMS=cpu)")
    from jax.experimental import topologies
    try:
        return list(topologies.get_topology_desc(platform="cuda", target_config=config_text(key),
                                                 topology=topology).devices)
    except NotImplementedError:
        raise ValueError("the CUDA plugin registered no GPU topology (it found no GPU driver): "
                         "set JAX_PLATFORMS=cpu before JAX starts") from None

"""The target a program is built for: this host, or a TPU/GPU topology compiled ahead of time.

    target = parse("v5p:8x8x16")     # 1,024 abstract TPU v5p chips on 256 hosts (needs libtpu)
    target = parse("v5p:8x8x16*2")   # two such slices joined by the data-center network (DCN)
    target = parse("h100:1x1x8")     # 8 H100s on one host (needs the CUDA plugin, JAX_PLATFORMS=cpu)
    target = host()                  # this machine's own devices, jax.process_count() hosts
    mesh = sharding.make_mesh(config.mesh, target.devices)

TPU targets are named as JAX names topologies (`v5e:2x2`, `v5p:8x8x16`, `v6e:16x16`, `v4:4x4x4`)
and built by `jax.experimental.topologies.get_topology_desc`; GPU targets `h100:AxBxC` (slices x
hosts per slice x GPUs per host) from an XLA GPU target config (a GpuTargetConfigProto in text
form, `transformer/parallel/gpu_targets/<chip>.txtpb`). A program built over `target.devices`
is the one that chip would run: everything it becomes is decided by the mesh's devices, never
by the host that builds it (ARCHITECTURE.md).

Hosts: a TPU target's hosts are those libtpu assigns the topology (its default of 4 chips per
host, `process_index`): v4 and v5p VMs hold 4 chips; v5e and v6e come as 1-, 4- and 8-chip VMs
(Cloud TPU docs list 8 chips per host for v5e), and for a multi-host slice they are 4-chip VMs
(ct5lp-hightpu-4t, ct6e-standard-4t), which is what libtpu lays out.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tempfile

GiB = 2**30
# What libtpu lets a program use per chip, below the datasheet's HBM: the "available HBM" of
# its RESOURCE_EXHAUSTED message (libtpu 0.0.42.1, jax 0.10.2, measured 2026-12-07 by
# compiling a 400 GiB program for one chip of each; tests/test_compile.py checks them).
LIBTPU_HBM = {"v4": 30.75 * GiB, "v5e": 15.75 * GiB, "v5p": 95.74 * GiB, "v6e": 31.25 * GiB}

# Per-chip TPU facts, each from its public source (GPUs': parallel/gpu_targets, beside the
# XLA target configs) (HBM bandwidth hbm_bw from the same pages, in
# bytes/s: what bounds a decode step, which reads every weight once). Interconnect: one direction's bandwidth per chip
# over all its links (Cloud TPU's "interchip interconnect" Gbps / 8, half the "bidirectional"
# GBps of its newer pages; NVLink's total / 2): the roofline divides per-chip collective bytes
# by it.
CHIPS = {
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOPs bf16, 32 GiB HBM2; ICI 2400 Gbps
    # (the v4 column of https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer)
    "v4": dict(kind="TPU v4", hbm=32 * GiB, peak=275e12, link=2400e9 / 8, hbm_bw=1200e9),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, 16 GB HBM, ICI 1600 Gbps
    # (400 GBps bidirectional)
    "v5e": dict(kind="TPU v5 lite", hbm=16 * GiB, peak=197e12, link=1600e9 / 8, hbm_bw=819e9),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs bf16, 95 GiB HBM2e, ICI 4800 Gbps
    # (1200 GBps bidirectional)
    "v5p": dict(kind="TPU v5", hbm=95 * GiB, peak=459e12, link=4800e9 / 8, hbm_bw=2765e9),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs bf16, 32 GB HBM, ICI 3200 Gbps
    # (800 GBps bidirectional)
    "v6e": dict(kind="TPU v6 lite", hbm=32 * GiB, peak=918e12, link=3200e9 / 8, hbm_bw=1640e9),
}
TPUS = ("v4", "v5e", "v5p", "v6e")
GPUS = ("h100", "h200", "a100")
TPU_INSTALL = 'pip install -e ".[compile]" (libtpu: jax[tpu]==0.10.2)'
CUDA_INSTALL = 'pip install -e ".[cuda12]", and run with JAX_PLATFORMS=cpu'


class TargetError(ValueError):
    """A target that cannot be built here: one line, saying what to do."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str            # as given: "v5p:8x8x16", "h100:1x1x8", "host"
    platform: str        # the devices' platform: tpu, gpu, cpu
    devices: tuple       # jax devices (abstract ones for a topology)
    hosts: int           # processes a run on it has (one per host)
    hbm_bytes: float | None      # per chip; None: unknown (the host)
    peak_flops: float | None     # bf16 FLOP/s per chip
    link_bytes_s: float | None   # interconnect bandwidth per chip, one direction
    hbm_bytes_s: float | None = None  # HBM bandwidth per chip
    usable_bytes: float | None = None  # what the device reports (libtpu, CUDA); None: hbm_bytes

    @property
    def memory_bytes(self) -> float | None:
        """Per chip, what a program may use: the device's reported memory, else the datasheet."""
        return self.usable_bytes or self.hbm_bytes

    @property
    def chips(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        line = f"target: {self.name}, {self.chips} {self.devices[0].device_kind} chips on " \
               f"{self.hosts} host{'s' if self.hosts > 1 else ''}"
        if self.hbm_bytes:
            line += (f"; per chip {self.hbm_bytes / GiB:.1f} GiB HBM ({self.memory_bytes / GiB:.2f} "
                     "usable as the device reports it), "
                     f"{self.peak_flops / 1e12:.0f} TFLOP/s bf16 peak, "
                     f"{self.link_bytes_s / 1e9:.0f} GB/s interconnect")
        return line


def matmul_choice(platform: str):
    """What `model.matmul=auto` means for a program built for `platform`: on a TPU or GPU
    `plain`; on a CPU (this host: the only CPU a program is built for here) by its flags and
    the ISA cap in XLA_FLAGS (model/kernels/auto.py decides; this reads the facts)."""
    from transformer import host as host_facts
    from transformer.model.kernels import auto
    if platform != "cpu":
        return auto.choose(platform)
    return auto.choose("cpu", host_facts.cpu_flags(host_facts.read_cpuinfo()),
                       host_facts.max_isa(os.environ.get("XLA_FLAGS")))


def resolve_matmul(config, platform: str | None = None):
    """(config with model.matmul concrete for `platform`, the auto.Choice); default platform:
    this host's backend. An explicit mode wins."""
    from transformer.model.kernels import auto
    if platform is None:
        import jax
        platform = jax.default_backend()
    if config.model.matmul != "auto":
        return auto.resolve(config, None)
    return auto.resolve(config, matmul_choice(platform))


def host() -> Target:
    """This machine: its own devices, one host per process."""
    import jax
    devices = tuple(jax.devices())
    return Target("host", devices[0].platform, devices, jax.process_count(), None, None, None)


_NAME = re.compile(r"^(?P<chip>[a-z0-9]+):(?P<shape>\d+(?:x\d+){1,2})(?:\*(?P<slices>\d+))?$")


def parse(name: str) -> Target:
    """The target a name means; TargetError (one line) for a malformed name or a missing
    plugin."""
    match = _NAME.match(name.strip().lower())
    names = ", ".join(f"{c}:..." for c in TPUS + GPUS)
    if not match or match["chip"] not in TPUS + GPUS:
        raise TargetError(f"--target={name}: not a target name; one of {names} with a "
                          "topology such as v5e:2x2, v5p:8x8x16, v6e:16x16, h100:1x1x8")
    chip, shape, slices = match["chip"], match["shape"], int(match["slices"] or 1)
    if chip in TPUS:
        return tpu(chip, shape, slices)
    if slices != 1:
        raise TargetError(f"--target={name}: GPU hosts are named in the topology "
                          f"(SLICESxHOSTSxGPUS, e.g. {chip}:1x2x8), not with *N")
    if shape.count("x") != 2:
        raise TargetError(f"--target={name}: a GPU topology is SLICESxHOSTSxGPUS, e.g. "
                          f"{chip}:1x1x8")
    _need_cuda(chip, shape)  # before the config: the install line is what to do first
    return gpu(chip, shape, gpu_target_config(chip))


def tpu(chip: str, shape: str, slices: int = 1) -> Target:
    """`slices` copies of the topology joined by the data-center network (multi-slice)."""
    from transformer.parallel import links
    if slices > 1 and links.DCN.get(chip) is None:
        raise TargetError(f"--target={chip}:{shape}*{slices}: no published DCN bandwidth for "
                          f"{chip} to price traffic between slices (parallel/links.py)")
    if importlib.util.find_spec("libtpu") is None:
        raise TargetError(f"compiling for TPU {chip}:{shape} needs libtpu: {TPU_INSTALL}")
    from jax.experimental import topologies
    # libtpu takes /tmp/libtpu_lockfile in every JAX process that loads it, and refuses a
    # second: a topology is only described here, never run, so any other JAX process on this
    # machine (a training run, a test worker) must not stop it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        with _quiet_stderr():  # libtpu's start-up complains that this host is not a TPU VM
            # v4 chips hold two TensorCores that libtpu lists as two devices unless asked for
            # one per chip (megacore), as JAX runs a v4 and as v5p's topologies already come
            desc = topologies.get_topology_desc(
                platform="tpu", topology_name=f"{chip}:{shape}",
                **({"chip_config_name": "megacore"} if chip == "v4" else {}),
                **({"num_slices": slices} if slices > 1 else {}))
    except Exception as e:  # noqa: BLE001 - libtpu's refusal, as one line
        raise TargetError(f"--target={chip}:{shape}: {_first_line(e)}") from None
    devices = tuple(desc.devices)
    facts = CHIPS[chip]
    name = f"{chip}:{shape}" + (f"*{slices}" if slices > 1 else "")
    return Target(name, "tpu", devices, len({d.process_index for d in devices}),
                  facts["hbm"], facts["peak"], facts["link"], facts["hbm_bw"], LIBTPU_HBM[chip])


def gpu_target_config(chip: str) -> str:
    """The GpuTargetConfigProto text shipped for `chip` (parallel/gpu_targets/<chip>.txtpb)."""
    from transformer.parallel import gpu_targets
    return gpu_targets.config_text(chip)


def gpu(chip: str, shape: str, target_config: str) -> Target:
    """A GPU topology from a target config's text: the seam for any GpuTargetConfigProto."""
    _need_cuda(chip, shape)
    import jax
    from jax.experimental import topologies
    if jax.config.jax_platforms != "cpu" and os.environ.get("JAX_PLATFORMS") != "cpu":
        raise TargetError(f"compiling for GPU {chip}:{shape} without a GPU needs "
                          "JAX_PLATFORMS=cpu (the CUDA plugin otherwise looks for a device)")
    slices, hosts, per_host = map(int, shape.split("x"))
    try:
        desc = topologies.get_topology_desc(platform="cuda", target_config=target_config,
                                            topology=shape)
    except Exception as e:  # noqa: BLE001
        raise TargetError(f"--target={chip}:{shape}: {_first_line(e)}") from None
    from transformer.parallel import gpu_targets
    facts = gpu_targets.chip(chip)
    return Target(f"{chip}:{shape}", "gpu", tuple(desc.devices), slices * hosts,
                  facts.hbm_bytes, facts.peak_bf16_flops, facts.nvlink_one_way_bytes_per_s,
                  facts.hbm_bytes_per_s, facts.reported_bytes)


def _need_cuda(chip: str, shape: str) -> None:
    if not any(importlib.util.find_spec(p) for p in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
        raise TargetError(f"compiling for GPU {chip}:{shape} needs the CUDA plugin: "
                          f"{CUDA_INSTALL}")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class _quiet_stderr:
    """Sends fd 2 to a file while libtpu starts (its C++ logs bypass Python), replaying it
    only if the call fails."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)

    def __exit__(self, kind, *_):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        if kind is not None and os.environ.get("TRANSFORMER_DEBUG"):
            self.file.seek(0)
            sys.stderr.write(self.file.read().decode(errors="replace"))
        self.file.close()

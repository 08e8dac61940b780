"""What a collective costs on the links its replica group actually spans.

    price = links.price(ops, mesh_devices, target)   # ops: tools/collectives.py's Ops
    price["networks"]["ici"]["seconds"], price["networks"]["dcn"]["bytes"], price["seconds"]

A chip does not send every collective at its whole interconnect bandwidth:
- TPU, inside a slice (ICI): a ring along one torus axis uses the 2 ports of that axis (one
  each way round the ring), so 2 of a v5e's 4 ports or 2 of a v5p's 6; a group spanning two
  axes uses 4, three axes 6. Bandwidth per port, one direction: the chip's bidirectional ICI
  bandwidth / 2 / its ports (CHIP_LINKS, each cited). Small slices without wraparound links
  are priced as if they had them (optimistic by up to 2x on such a ring).
- TPU, between slices (DCN, multi-slice): the data-center network, per chip as Cloud TPU
  quotes it (DCN).
- GPU, inside a host: NVLink through NVSwitch, any group at the GPU's NVLink bandwidth one way.
- GPU, between hosts: the GPU's own network card (InfiniBand or RoCE), as NCCL's rings and
  trees cross hosts at the per-GPU NIC rate (NETWORK, each cited).
A ring collective over n devices moves (n-1)/n of its result per chip (an all-reduce twice
that: a reduce-scatter then an all-gather); a collective-permute its result once. The
collectives run one after another: their times add.
"""

from __future__ import annotations

import math

# chip: (bidirectional ICI bytes/s per chip, ICI ports per chip), from Cloud TPU's pages
CHIP_LINKS = {
    # https://cloud.google.com/tpu/docs/v4: 3D torus, 6 ports; ICI 2400 Gbps one way per chip
    # (the v4 column of the v5p announcement, tools' CHIPS) = 300 GB/s, so 600 GB/s both ways
    "v4": (600e9, 6),
    # https://docs.cloud.google.com/tpu/docs/v5e: bidirectional ICI 400 GBps, 4 ports, 2D torus
    "v5e": (400e9, 4),
    # https://docs.cloud.google.com/tpu/docs/v5p: bidirectional ICI 1200 GBps, 3D torus (6 ports)
    "v5p": (1200e9, 6),
    # https://docs.cloud.google.com/tpu/docs/v6e: bidirectional ICI 800 GBps, 4 ports, 2D torus
    "v6e": (800e9, 4),
}
# DCN bytes/s per chip, one way (None: no published figure; a multi-slice target is refused)
DCN = {
    # https://docs.cloud.google.com/tpu/docs/v5p: "Data center network (DCN) bandwidth per
    # chip (Gbps) 50"
    "v5p": 50e9 / 8,
    # https://docs.cloud.google.com/tpu/docs/v5e: "Per-host NIC configuration 2 x 100 Gbps"
    # for 8 chips per host (and 6.4 Tbps per 256-chip pod): 25 Gbps per chip
    "v5e": 25e9 / 8,
}
# GPU: the network between hosts, bytes/s per GPU one way
NETWORK = {
    # NVIDIA DGX H100 user guide: 8 single-port ConnectX-7 cards, 400 Gb/s InfiniBand or
    # Ethernet each, one per GPU (https://docs.nvidia.com/dgx/dgxh100-user-guide/)
    "h100": 400e9 / 8,
    # NVIDIA DGX H200: the same 8 x ConnectX-7 400 Gb/s (https://www.nvidia.com/en-us/data-center/dgx-h200/)
    "h200": 400e9 / 8,
    # NVIDIA DGX A100 user guide: 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand
    # (https://docs.nvidia.com/dgx/dgxa100-user-guide/)
    "a100": 200e9 / 8,
}
TRAFFIC = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0,
           "collective-permute": 1.0}
FAST = {"tpu": "ici", "gpu": "nvlink"}
SLOW = {"tpu": "dcn", "gpu": "network"}


def chip_of(target) -> str:
    return target.name.split(":")[0].split("*")[0]


def link(devices: list, target) -> tuple[str, float, str]:
    """(network, bytes/s per chip one way, why) for a group of devices of `target`."""
    chip, kind = chip_of(target), target.platform
    if kind == "tpu":
        if len({getattr(d, "slice_index", 0) for d in devices}) > 1:
            return "dcn", DCN[chip], "between slices"
        both_ways, ports = CHIP_LINKS[chip]
        axes = sum(len({tuple(d.coords)[i] for d in devices}) > 1
                   for i in range(len(devices[0].coords)))
        axes = max(1, axes)
        return "ici", both_ways / 2 / ports * 2 * axes, f"{axes} torus axis" + "es" * (axes > 1)
    if kind == "gpu":
        if len({d.process_index for d in devices}) > 1:
            return "network", NETWORK[chip], "between hosts"
        return "nvlink", target.link_bytes_s, "NVLink inside a host"
    return "host", target.link_bytes_s or math.inf, "this host"


def price(ops: list, mesh_devices: list, target) -> dict:
    """Each collective's bytes and seconds on the networks it crosses, summed per network:
    {"networks": {name: {"ops", "bytes" (results), "sent" (bytes a chip sends on it),
    "seconds"}}, "seconds": total}. A group XLA printed in a form not read (op.groups None)
    is priced as if it spanned every device. A TPU group spanning slices runs hierarchically
    (as XLA does for multi-slice): inside each slice over ICI, and only 1/k of the bytes (k
    chips of the group per slice) over DCN."""
    networks = {}

    def add(name, op, sent, bandwidth, result=True):
        entry = networks.setdefault(name, {"ops": 0, "bytes": 0, "sent": 0, "seconds": 0.0})
        entry["ops"] += op.runs if result else 0
        entry["bytes"] += op.bytes * op.runs if result else 0
        entry["sent"] += sent
        entry["seconds"] += sent / bandwidth if bandwidth else 0.0

    slices = len({getattr(d, "slice_index", 0) or 0 for d in mesh_devices})
    for op in ops:
        if op.network == "dcn":  # a transfer between slices (tools/collectives.py)
            add("dcn", op, TRAFFIC[op.kind] * op.bytes * op.runs * (slices - 1) / max(slices, 1),
                DCN[chip_of(target)])
            continue
        ids = op.groups[0] if op.groups is not None else range(len(mesh_devices))
        devices = [mesh_devices[i] for i in ids if i < len(mesh_devices)] or list(mesh_devices)
        name, bandwidth, _ = link(devices, target)
        if op.kind == "collective-permute":
            add(name, op, op.bytes * op.runs, bandwidth)
            continue
        if name == "dcn":
            slices = {}
            for d in devices:
                slices.setdefault(d.slice_index, []).append(d)
            s, k = len(slices), len(devices) // len(slices)
            add("dcn", op, TRAFFIC[op.kind] * op.bytes * op.runs / k * (s - 1) / s, bandwidth)
            if k > 1:
                ici = link(next(iter(slices.values())), target)[1]
                add("ici", op, TRAFFIC[op.kind] * op.bytes * op.runs * (k - 1) / k, ici, False)
            continue
        n = len(devices)
        add(name, op, TRAFFIC[op.kind] * op.bytes * op.runs * (n - 1) / n if n > 1 else 0,
            bandwidth)
    return {"networks": networks, "seconds": sum(v["seconds"] for v in networks.values())}


def axis_bandwidth(target, inner: int, size: int) -> float:
    """Before compiling (compile --search's guess): bytes/s one way per chip for a collective
    along a mesh axis of `size` devices laid out inside `inner` devices of the axes within
    it. The devices of a target are listed host by host and slice by slice, so an axis whose
    groups reach past a host (GPU) or a slice (TPU) crosses the slower network; on a TPU a
    ring is taken along one torus axis (2 ports)."""
    chip, reach = chip_of(target), inner * size
    if target.platform == "gpu":
        per_host = target.chips // max(target.hosts, 1)
        return NETWORK[chip] if reach > per_host else target.link_bytes_s
    slices = len({getattr(d, "slice_index", 0) or 0 for d in target.devices})
    if slices > 1 and reach > target.chips // slices:
        return DCN[chip]
    both_ways, ports = CHIP_LINKS[chip]
    return both_ways / ports

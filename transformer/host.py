"""Facts about the machine this process runs on, read from Linux's files, in one place.

    host.cpu_model()             the CPU's model name, for every published timing
    host.cpu_line()              model, family/model numbers and vector ISA: a record's machine
    host.cpu_flags(host.read_cpuinfo())         the first CPU's feature flags: {"avx2", ...}
    host.max_isa(os.environ.get("XLA_FLAGS"))   "AVX2" for --xla_cpu_max_isa=AVX2, else None
    host.usable_cores()          the cores this process may run on, at most its cgroup quota
    host.l3_bytes()              CPU 0's level-3 cache, 0 where sysfs does not say
    host.available_memory()      bytes it can still take: MemAvailable, at most cgroup memory.max
    host.accelerator_files()     a GPU's or TPU's device files ([] on a CPU-only machine)

Each reader takes the file (or text) it reads as an argument with the real one as default,
so tests point it at a fake; each returns a neutral value (empty, 0, None, the CPU count)
where the file is missing or unreadable, as it is off Linux. What to do with a fact (which
matmul mode `auto` means, how many decode programs to run at once) is decided by its user:
this module reads, it never decides. A root module: it imports no room of the package, and
every room may import it.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # this process's cgroup (v2) inside a container
CPU0_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# NVIDIA's driver; a TPU VM's chips (/dev/accel* on v2-v5e, /dev/vfio/N on v5p and v6e)
ACCELERATOR_FILES = ("/dev/nvidiactl", "/dev/accel*", "/dev/vfio/[0-9]*")


def read_cpuinfo(path: Path = CPUINFO) -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo's text (x86 `flags`, ARM
    `Features`; empty if it has none)."""
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo's first `model name`), for every published timing."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    match = re.search(r"^model name\s*:(.*)$", text, re.MULTILINE)
    if match:
        return match.group(1).strip()
    import platform
    return platform.processor() or "unknown CPU"


def cpu_line(cpuinfo: str | None = None) -> str:
    """The CPU for a record: its model name, family/model numbers (a "AMD EPYC" is Zen 3 as
    family 25 model 1, Zen 4 as family 25 model 17, Zen 5 as family 26) and the vector ISA
    that decides kernel speed, e.g. "AMD EPYC, family 25 model 17, 2 CPUs, avx2 avx512f"."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("cpu family", "model") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_flags(text)]
    return (f"{cpu_model(text)}, family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}, {os.cpu_count()} CPUs, {' '.join(isa) or 'no AVX2'}")


def max_isa(xla_flags: str | None) -> str | None:
    """The ISA that `--xla_cpu_max_isa=...` in an XLA_FLAGS value caps XLA's CPU code at,
    upper-cased, or None."""
    match = re.search(r"--xla_cpu_max_isa=(\w+)", xla_flags or "")
    return match.group(1).upper() if match else None


def usable_cores(cgroup: Path = CGROUP) -> int:
    """The cores this process may run on (taskset, cpusets), at most its CPU quota (a
    container's `--cpus`: cgroup v2's cpu.max, "quota period" or "max period")."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def l3_bytes(cache_dir: Path = CPU0_CACHE) -> int:
    """CPU 0's level-3 cache from Linux's sysfs (its `size`, e.g. "32768K"), or 0."""
    for index in sorted(cache_dir.glob("index*")):
        try:
            if (index / "level").read_text().strip() == "3":
                size = (index / "size").read_text().strip()
                units = {"K": 2**10, "M": 2**20, "G": 2**30}
                return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except (OSError, ValueError):
            return 0
    return 0


def available_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """Bytes of host memory this process can still take: Linux's MemAvailable, at most what
    its cgroup's memory.max leaves (a container's limit, which MemAvailable does not see).
    None where neither is known."""
    known = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            known.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(known) if known else None


def accelerator_files(patterns=ACCELERATOR_FILES) -> list[str]:
    """The device files of a GPU or TPU on this machine: none on a CPU-only one, whatever
    plugins are installed (libtpu comes with the compile extra, to build for TPU topologies)."""
    return sorted(f for pattern in patterns for f in glob.glob(pattern))

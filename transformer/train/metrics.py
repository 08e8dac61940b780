"""What a run reports: a progress bar, `metrics.jsonl`, and throughput figures.

`metrics.jsonl` gets one JSON object per line, appended, so a resumed run continues the file:
    {"step": 100, "train_loss": 2.31, "tokens_per_s": 10234.0, "lr": 0.001, ...}
    {"step": 200, "val_loss": 2.12, ...}                       (evaluation lines)
Every line also goes to the run's trackers (trackers.py: TensorBoard), so the curves there
are these numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm


class MetricsLog:
    """Appends metric dicts to <workdir>/metrics.jsonl (only where `enabled`, e.g. process 0)."""

    def __init__(self, workdir, enabled: bool = True, tracker=None):
        self.path = Path(workdir) / "metrics.jsonl"
        self.enabled = enabled
        self.tracker = tracker  # trackers.Tracker or None; gets every line written
        self._next: dict = {}

    def add_to_next(self, **values) -> None:
        """Values carried by the next line written only (e.g. what this invocation runs)."""
        self._next.update(values)

    def write(self, **values) -> None:
        if not self.enabled:
            return
        values, self._next = {**values, **self._next}, {}
        values = {k: (float(v) if hasattr(v, "dtype") else v) for k, v in values.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(values) + "\n")
        if self.tracker is not None and "step" in values:
            self.tracker.log(values["step"], values)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None

    def truncate_after(self, step: int) -> None:
        """Drops lines past `step`: a resumed run redoes those steps and logs them again."""
        if not self.enabled or not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if _line_step(line) is not None and _line_step(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)  # atomic: a kill now leaves the old file or the new one

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class Progress:
    """A progress bar with loss and tokens/s, written to stderr."""

    def __init__(self, start: int, total: int, enabled: bool = True, lines: bool = True):
        self.lines = lines  # write() prints (evaluation lines): only process 0's do
        self.bar = tqdm(total=total, initial=start, disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, mininterval=1.0, unit="step")

    def update(self, n: int = 1, **postfix) -> None:
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix({k: _short(v) for k, v in postfix.items()}, refresh=False)

    def set_postfix(self, **postfix) -> None:
        self.bar.set_postfix({k: _short(v) for k, v in postfix.items()}, refresh=False)

    def write(self, line: str) -> None:
        if self.lines:
            self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


class Throughput:
    """Tokens per second between two calls of `tick`."""

    def __init__(self):
        self.time = time.perf_counter()

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside this block does not count."""
        begin = time.perf_counter()
        yield
        self.time += time.perf_counter() - begin

    def tick(self, tokens: int) -> float:
        now = time.perf_counter()
        rate = tokens / max(now - self.time, 1e-9)
        self.time = now
        return rate


def _line_step(line: str):
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return None  # blank, or cut short by a kill: dropped


def _short(v):
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return v


# --- Model FLOPs utilisation -------------------------------------------------------------
# Dense peak FLOP/s per chip from the vendors' datasheets (no sparsity), by the name in
# `jax.devices()[0].device_kind` that names the chip (`datasheet`): a name not followed by a
# digit, so that "L4" is not an L40S (3x the L4's peak) and "A10" not an A100. Checked in
# order: "TPU v5 lite" before "TPU v5" (the name a v5p reports).
# "tf32": what a float32 matmul runs at on NVIDIA GPUs from Ampere on, where XLA computes
# float32 dots in TF32 at jax's default matmul precision (`float32_matmul_precision`).
PEAK_FLOPS = {  # device kind: {dtype: FLOP/s}
    "H200": {"bfloat16": 989e12, "tf32": 494.7e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "tf32": 494.7e12, "float32": 67e12},  # SXM; PCIe ~756/378/51
    "A100": {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "tf32": 60e12, "float32": 30e12},
    "A10": {"bfloat16": 125e12, "tf32": 62.5e12, "float32": 31e12},
    "V100": {"bfloat16": 125e12, "float32": 15.7e12},   # fp16 tensor cores; no TF32
    "TPU v6": {"bfloat16": 918e12, "float32": 918e12 / 4},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 4},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12 / 4},  # v5e
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 4},
    "TPU v5": {"bfloat16": 459e12, "float32": 459e12 / 4},  # v5p (jax's pallas tpu_info)
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 4},
    "TPU v3": {"bfloat16": 123e12, "float32": 123e12 / 4},
}


def datasheet(device_kind: str) -> str | None:
    """The PEAK_FLOPS entry naming this device kind, or None: the first key found in it
    (any case) and not followed by a digit."""
    kind = device_kind.lower()
    for key in PEAK_FLOPS:
        if re.search(re.escape(key.lower()) + r"(?!\d)", kind):
            return key
    return None


def float32_matmul_precision(device) -> str:
    """What a float32 matmul on `device` runs as at jax's current default matmul precision
    (`jax_default_matmul_precision`, or the `jax.default_matmul_precision` context):
    "float32" when it asks for full float32 ("highest" / "float32"), or on a CPU; otherwise
    "tf32" on an NVIDIA GPU with TF32 (unless NVIDIA_TF32_OVERRIDE=0) and "bfloat16" on a TPU
    at the default precision (one bfloat16 pass)."""
    import os

    import jax

    precision = str(jax.config.jax_default_matmul_precision or "default").lower()
    if device.platform == "cpu" or precision in ("highest", "float32"):
        return "float32"
    if device.platform == "gpu":
        return "float32" if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0" else "tf32"
    if device.platform == "tpu" and precision in ("default", "bfloat16", "fastest"):
        return "bfloat16"
    return "float32"


_MEASURED_PEAK: dict = {}


def measure_matmul_peak(dtype: str = "float32", n: int = 1024, reps: int = 20) -> float:
    """The best FLOP/s of an n×n×n matmul on the default device (the CPU's practical peak).

    dtype "bfloat16" multiplies bfloat16 inputs with float32 accumulation, as
    `model.matmul = "fast_bf16"` does. Cached per (dtype, n) for the process.
    """
    import jax
    import jax.numpy as jnp

    if (dtype, n) in _MEASURED_PEAK:
        return _MEASURED_PEAK[dtype, n]
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        begin = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - begin)
    _MEASURED_PEAK[dtype, n] = 2 * n**3 / best
    return _MEASURED_PEAK[dtype, n]


def measured_elsewhere(dtype: str, flops: float, n: int = 1024) -> None:
    """Takes `flops` as this process's measure_matmul_peak(dtype, n): a test session measures
    the CPU's peaks once and hands them to every train.py it starts (faults.TestHooks)."""
    _MEASURED_PEAK[dtype, n] = flops


def peak_flops(dtype: str = "float32", device=None) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for one device: the table for accelerators, a
    measured matmul on CPU (or on an accelerator the table does not know)."""
    import jax

    device = device or jax.devices()[0]
    kind = datasheet(device.device_kind) if device.platform != "cpu" else None
    if kind is not None:
        peaks = PEAK_FLOPS[kind]
        used = float32_matmul_precision(device) if dtype == "float32" else dtype
        if used in peaks and used != dtype:  # the peak of the precision run
            return peaks[used], (f"datasheet ({kind}; float32 matmuls run as {used} "
                                 "at jax's default precision)")
        return peaks[dtype], f"datasheet ({kind})"
    return measure_matmul_peak(dtype), f"measured ({device.device_kind} matmul)"


def mfu(tokens_per_s: float, flops_per_token: float, peak: float, n_devices: int = 1) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of the devices used."""
    return tokens_per_s * flops_per_token / (peak * n_devices)

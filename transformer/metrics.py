"""What a run reports: a progress bar, `metrics.jsonl`, and throughput figures.

`metrics.jsonl` gets one JSON object per line, appended, so a resumed run continues the file:
    {"step": 100, "train_loss": 2.31, "tokens_per_s": 10234.0, "lr": 0.001, ...}
    {"step": 200, "val_loss": 2.12, ...}                       (evaluation lines)
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

from tqdm import tqdm


class MetricsLog:
    """Appends metric dicts to <workdir>/metrics.jsonl (only where `enabled`, e.g. process 0)."""

    def __init__(self, workdir, enabled: bool = True):
        self.path = Path(workdir) / "metrics.jsonl"
        self.enabled = enabled

    def write(self, **values) -> None:
        if not self.enabled:
            return
        values = {k: (float(v) if hasattr(v, "dtype") else v) for k, v in values.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(values) + "\n")

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class Progress:
    """A progress bar with loss and tokens/s, written to stderr."""

    def __init__(self, start: int, total: int, enabled: bool = True):
        self.bar = tqdm(total=total, initial=start, disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, mininterval=1.0, unit="step")

    def update(self, n: int = 1, **postfix) -> None:
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix({k: _short(v) for k, v in postfix.items()}, refresh=False)

    def set_postfix(self, **postfix) -> None:
        self.bar.set_postfix({k: _short(v) for k, v in postfix.items()}, refresh=False)

    def write(self, line: str) -> None:
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


def _short(v):
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return v


# --- Model FLOPs utilisation -------------------------------------------------------------
# Dense peak FLOP/s per chip from the vendors' datasheets (no sparsity), by the substring of
# `jax.devices()[0].device_kind` that names the chip. Checked in order: "H100" before "H10".
PEAK_FLOPS = {  # device kind: {dtype: FLOP/s}
    "H200": {"bfloat16": 989e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "float32": 67e12},   # SXM; PCIe is ~756 / 51
    "A100": {"bfloat16": 312e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "float32": 30e12},
    "A10": {"bfloat16": 125e12, "float32": 31e12},
    "V100": {"bfloat16": 125e12, "float32": 15.7e12},   # fp16 tensor cores
    "TPU v6": {"bfloat16": 918e12, "float32": 918e12 / 4},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 4},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12 / 4},  # v5e
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 4},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 4},
    "TPU v3": {"bfloat16": 123e12, "float32": 123e12 / 4},
}


def flops_per_token(n_layers: int, d_model: int, d_ff: int, vocab_size: int, seq_len: int,
                    n_heads: int | None = None) -> float:
    """Training FLOPs per token: 6N + 6·L·T·D (Kaplan et al. 2020, PaLM appendix B).

    N counts the parameters that take part in matmuls: per layer 4·D² (Q, K, V, O) + 2·D·F
    (the MLP), plus the V·D output head; embeddings are lookups and do not count. Forward is
    2 FLOPs per parameter and backward twice that, hence 6N. Attention's QK^T and AV are
    2·T·D each per token and layer in the forward pass when every key is computed; a causal
    model needs only the lower triangle, so it counts half: 2·T·D forward, 6·L·T·D in all.
    (To be replaced by transformer/flops.py, the project's shared counter, when it lands.)
    """
    n_matmul = n_layers * (4 * d_model * d_model + 2 * d_model * d_ff) + vocab_size * d_model
    return 6.0 * n_matmul + 6.0 * n_layers * seq_len * d_model


def model_flops_per_token(model_config) -> float:
    m = model_config
    return flops_per_token(m.n_layers, m.d_model, m.d_ff, m.vocab_size, m.max_seq_len)


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


def peak_flops(dtype: str = "float32", device=None) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for one device: the table for accelerators, a
    measured matmul on CPU (or on an accelerator the table does not know)."""
    import jax

    device = device or jax.devices()[0]
    if device.platform != "cpu":
        for kind, peaks in PEAK_FLOPS.items():
            if kind.lower() in device.device_kind.lower():
                return peaks[dtype], f"datasheet ({kind})"
    return measure_matmul_peak(dtype), f"measured ({device.device_kind} matmul)"


def mfu(tokens_per_s: float, flops_per_token: float, peak: float, n_devices: int = 1) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of the devices used."""
    return tokens_per_s * flops_per_token / (peak * n_devices)

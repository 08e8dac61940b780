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

    def __init__(self, start: int, total: int, enabled: bool = True):
        self.bar = tqdm(total=total, initial=start, disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, mininterval=1.0, unit="step")

    def update(self, n: int = 1, **postfix) -> None:
        self.bar.update(n)
        if postfix:
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


def _line_step(line: str):
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return None  # blank, or cut short by a kill: dropped


def _short(v):
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return v

"""`train.profile`: a jax.profiler trace of a range of steps, written into the workdir.

    train.profile = "10:15"       traces steps 10, 11, 12, 13, 14 (1-based as logged; the end
                                  excluded, like a Python range); "" = off

The trace goes to <workdir>/plugins/profile/<time>/, where TensorBoard's profile plugin looks
(`tensorboard --logdir=<workdir>`, with `pip install tensorboard-plugin-profile`, next to
the run's scalars) as `<host>.xplane.pb`, and as `<host>.trace.json.gz` / `perfetto_trace.json.gz`
for https://ui.perfetto.dev (docs/performance.md). The host waits for the step before the
range and for the range's last step, so the trace holds exactly those steps' work; waiting
changes when the host looks, never what a step computes (tests/test_training.py checks that a
profiled run ends with the same params and losses).
"""

from __future__ import annotations

from pathlib import Path

import jax

from transformer.config.fields import step_range


class StepTrace:
    """Starts jax.profiler before step `start` and stops it after step `stop - 1`."""

    def __init__(self, spec: str, workdir, log=print, enabled: bool = True):
        span = step_range(spec) if enabled else None
        self.start, self.stop = span or (0, 0)
        self.logdir, self.log, self.active = Path(workdir), log, False

    def before(self, done: int, state) -> None:
        """Called before step `done` is queued."""
        if done == self.start:
            jax.block_until_ready(state)  # earlier steps' work stays out of the trace
            jax.profiler.start_trace(str(self.logdir), create_perfetto_trace=True)
            self.active = True

    def after(self, done: int, state) -> None:
        """Called after step `done` is queued."""
        if self.active and done == self.stop - 1:
            jax.block_until_ready(state)  # the range's last step runs inside the trace
            self.close()
            self.log(f"profile: steps {self.start}..{done} traced into "
                     f"{self._newest()} (docs/performance.md: how to open it)")

    def close(self) -> None:
        """Stops a trace in progress (the run ended or stopped inside the range)."""
        if self.active:
            self.active = False
            jax.profiler.stop_trace()

    def _newest(self) -> Path:
        runs = sorted((self.logdir / "plugins" / "profile").glob("*"))
        return runs[-1] if runs else self.logdir


NO_TRACE = StepTrace("", ".", enabled=False)

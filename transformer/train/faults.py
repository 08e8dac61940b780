"""Numerical faults (a non-finite loss or gradient) and the test hooks that provoke faults.

The train step itself refuses a non-finite update: params and optimizer state stay as they
were and the step reports `nonfinite=True`. `NonFiniteGuard` reads that flag one step late
(so the host never waits on the step it just dispatched) and, by `train.nonfinite`:
    stop   raises NonFiniteError naming the step; the last checkpoint stays intact
    skip   counts the step (metrics: skipped_steps) and goes on with the next batch

    guard = NonFiniteGuard("stop", skipped=0)
    guard.push(done, metrics["nonfinite"])   # checks the previous step
    guard.flush()                            # checks everything pushed (before a save)

Test hooks provoke faults on purpose. They are a `TestHooks` value passed to the run, never
part of a config or a checkpoint; tests in the same process pass one directly, and tests that
kill a `train.py` subprocess set environment variables that train.py reads once, at start-up
(`TestHooks.from_env`), and nothing else reads:
    TRANSFORMER_TEST_NAN_STEP=k      the batch of step k gets NaN loss weights
    TRANSFORMER_TEST_STEP_DELAY=s    sleep s seconds after every step (kills land mid-run)
    TRANSFORMER_TEST_SAVE_DELAY=s    hold every checkpoint s seconds before its final rename
    TRANSFORMER_TEST_MATMUL_PEAKS=float32=F,bfloat16=G
                                     the CPU matmul peaks (FLOP/s) the MFU divides by, as
                                     measured once by the test session (tests/conftest.py),
                                     instead of each run measuring them again (~1 s of CPU)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import numpy as np


class NonFiniteError(RuntimeError):
    """The loss or gradient became NaN or infinite."""


class NonFiniteGuard:
    def __init__(self, policy: str, skipped: int = 0):
        self.policy, self.skipped = policy, skipped
        self._pending = []  # (step, device flag) not yet looked at

    def push(self, step: int, flag) -> None:
        self._pending.append((step, flag))
        while len(self._pending) > 1:
            self._check(*self._pending.pop(0))

    def flush(self) -> None:
        while self._pending:
            self._check(*self._pending.pop(0))

    def _check(self, step: int, flag) -> None:
        if not bool(np.asarray(flag)):  # waits for that step to finish
            return
        if self.policy == "skip":
            self.skipped += 1
            return
        self._pending.clear()
        raise NonFiniteError(
            f"step {step}: the loss or gradient is not finite (NaN or inf); stopped without "
            "applying it, the last checkpoint is intact. Lower train.lr or set "
            "train.grad_clip, or set train.nonfinite=skip to skip such steps")


@dataclasses.dataclass(frozen=True)
class TestHooks:
    """Faults to provoke in a run: all off by default."""

    __test__ = False  # not a pytest test class, despite the name

    nan_step: int = 0       # the batch of this step (1-based, as logged) gets NaN weights
    step_delay: float = 0.0  # seconds to sleep after every step
    save_delay: float = 0.0  # seconds each save is held before its final rename
    matmul_peaks: tuple = ()  # ((dtype, FLOP/s), ...) measured already: not measured again

    @classmethod
    def from_env(cls, environ=os.environ) -> "TestHooks":
        def number(name, kind):
            return kind(environ.get(f"TRANSFORMER_TEST_{name}", "0") or 0)
        peaks = tuple((dtype, float(flops)) for dtype, flops in (
            item.split("=") for item in environ.get("TRANSFORMER_TEST_MATMUL_PEAKS", "").split(",")
            if item))
        return cls(number("NAN_STEP", int), number("STEP_DELAY", float),
                   number("SAVE_DELAY", float), peaks)

    def poison(self, batch: dict, step: int) -> dict:
        if self.nan_step and step == self.nan_step:
            # NaN * weights keeps the array's kind and placement (numpy, or a sharded array)
            batch = {**batch, "weights": batch["weights"] * np.float32("nan")}
        return batch

    def after_step(self) -> None:
        if self.step_delay:
            time.sleep(self.step_delay)

    def install(self) -> None:
        """Delays orbax's final rename of every save, so a test can kill mid-save; takes the
        matmul peaks given as this process's measurement."""
        if self.save_delay:
            _delay_saves(self.save_delay)
        from transformer.train import metrics
        for dtype, flops in self.matmul_peaks:
            metrics.measured_elsewhere(dtype, flops)


NO_HOOKS = TestHooks()


def _delay_saves(delay: float) -> None:
    from orbax.checkpoint._src.path import atomicity  # private: a test hook only

    cls = atomicity.AtomicRenameTemporaryPath
    if getattr(cls, "_test_delayed", False):
        return
    original = cls.finalize

    async def slow_finalize(self, *args, **kwargs):
        await asyncio.sleep(delay)
        return await original(self, *args, **kwargs)

    cls.finalize, cls._test_delayed = slow_finalize, True

"""Numerical faults (a non-finite loss or gradient) and the test hooks that provoke faults.

The train step itself refuses a non-finite update: params and optimizer state stay as they
were and the step reports `nonfinite=True`. `NonFiniteGuard` reads that flag one step late
(so the host never waits on the step it just dispatched) and, by `train.nonfinite`:
    stop   raises NonFiniteError naming the step; the last checkpoint stays intact
    skip   counts the step (metrics: skipped_steps) and goes on with the next batch

    guard = NonFiniteGuard("stop", skipped=0)
    guard.push(done, metrics["nonfinite"])   # checks the previous step
    guard.flush()                            # checks everything pushed (before a save)

Test hooks, read from environment variables so they never enter a config or a checkpoint:
    TRANSFORMER_TEST_NAN_STEP=k      the batch of step k gets NaN loss weights
    TRANSFORMER_TEST_STEP_DELAY=s    sleep s seconds after every step (kills land mid-run)
    TRANSFORMER_TEST_SAVE_DELAY=s    hold every checkpoint s seconds before its final rename
"""

from __future__ import annotations

import asyncio
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


def _env_float(name: str) -> float:
    return float(os.environ.get(name, "0") or 0)


def poison(batch: dict, step: int) -> dict:
    """Test hook: NaN loss weights for step TRANSFORMER_TEST_NAN_STEP (1-based, as logged)."""
    if os.environ.get("TRANSFORMER_TEST_NAN_STEP") == str(step):
        # NaN * weights keeps the array's kind and placement (numpy, or a sharded jax array)
        batch = {**batch, "weights": batch["weights"] * np.float32("nan")}
    return batch


def step_delay() -> None:
    delay = _env_float("TRANSFORMER_TEST_STEP_DELAY")
    if delay:
        time.sleep(delay)


def install_save_delay() -> None:
    """Test hook: delays orbax's final rename of every save, so a test can kill mid-save."""
    delay = _env_float("TRANSFORMER_TEST_SAVE_DELAY")
    if not delay:
        return
    from orbax.checkpoint._src.path import atomicity  # private: a test hook only

    cls = atomicity.AtomicRenameTemporaryPath
    if getattr(cls, "_test_delayed", False):
        return
    original = cls.finalize

    async def slow_finalize(self, *args, **kwargs):
        await asyncio.sleep(delay)
        return await original(self, *args, **kwargs)

    cls.finalize, cls._test_delayed = slow_finalize, True

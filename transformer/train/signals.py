"""Graceful stop: SIGINT / SIGTERM ask the training loop to save and stop; a second one quits.

    with GracefulStop() as stop:
        for step in ...:
            if stop.requested:
                save(step); raise Stopped(stop.requested, step)
            ...

The handler only sets a flag: the loop looks at it between steps, where the state is whole,
saves a checkpoint at the current step and raises `Stopped`, which the command line turns
into one line and exit status 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM), the
shell's convention for "ended by a signal". A second signal ends the process at once (the
default action, restored by the first): the checkpoint being written is then simply not
committed, and the previous one stays the latest.
"""

from __future__ import annotations

import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """Training stopped on request after saving a checkpoint at `step`."""

    def __init__(self, signum: int, step: int):
        self.signum, self.step = signum, step
        self.status = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint "
                         "saved: run the same command again to resume")


class GracefulStop:
    def __init__(self):
        self.requested: int | None = None  # the signal number, once one arrived
        self._previous = {}

    def _handle(self, signum, frame):
        self.requested = signum
        # The next SIGINT/SIGTERM gets the default action: the kernel ends the process at
        # once, even while it waits inside XLA or orbax, where a Python handler could not run.
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint at the current step, then "
              "stopping (press Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

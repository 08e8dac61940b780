"""Ctrl-C during a long streamed generation: stop between device calls, not inside one.

    with InterruptBetweenChunks() as interrupt:
        while more_to_make:
            interrupt.check()        # raises KeyboardInterrupt here once Ctrl-C was pressed
            run_one_chunk()
"""

from __future__ import annotations

import signal
import threading


class InterruptBetweenChunks:
    """While a long generation runs: Ctrl-C (SIGINT) only asks it to stop, and `check`, called
    between chunks, raises the KeyboardInterrupt there, outside any device call (raised
    inside the streaming callback it would abort the call with an XLA error instead). A
    second Ctrl-C interrupts at once. Only in the main thread, where signals are handled."""

    def __enter__(self):
        self.requested, self.previous = False, None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False

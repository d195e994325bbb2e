"""Ctrl-C and SIGTERM ask the run to stop after the current step, instead of killing it mid-step."""

from __future__ import annotations

import contextlib
import signal


class StopSignals:
    """Within ``with StopSignals() as stop:``, SIGINT/SIGTERM set ``stop.requested``."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict = {}

    def _request(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

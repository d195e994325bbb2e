"""Ctrl-C and SIGTERM (and, in a SLURM job, the time-limit warning SIGUSR2) ask the run to stop after
the current step, instead of killing it mid-step.

Within ``with StopSignals() as stop:`` the first signal sets ``stop.requested`` and ``stop.signal``;
later ones only say that the run is already stopping, so a second Ctrl-C while the checkpoint is
written cannot interrupt the write. The previous handlers come back when the block ends.
"""

from __future__ import annotations

import contextlib
import logging
import signal

from common.startup import StartupInterrupted, start_up_over
from training import slurm

log = logging.getLogger("headlab.train")


class StopSignals:
    def __init__(self) -> None:
        self.requested = False
        self.signal: str | None = None  # the first signal's name, e.g. "SIGTERM"
        self._previous: dict = {}

    def _request(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s: already stopping after this step (saving the checkpoint); nothing is lost", name)
            return
        self.requested, self.signal = True, name

    def __enter__(self) -> StopSignals:
        try:
            start_up_over()  # the script's start-up guard (common/startup.py) hands over
        except StartupInterrupted as err:  # it came while starting and a library swallowed it: stop before a step
            self.requested, self.signal = True, signal.Signals(err.signum).name
        signals = [signal.SIGINT, signal.SIGTERM]
        if slurm.in_slurm_job():
            signals.append(signal.SIGUSR2)  # the launcher's warning before the time limit (--signal=USR2@...)
        for sig in signals:
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

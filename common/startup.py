"""Ctrl-C or SIGTERM while a script starts: one line saying nothing was started, then the end a signal gives.

A script takes seconds before its work begins (importing torch, composing the config, the plan, building the
model). Python's own answers there are a KeyboardInterrupt traceback from inside some import (Ctrl-C) and an exit
with nothing said (SIGTERM). Every entry point calls ``guard_start_up()`` before its other imports; where the work
begins, the work's own handling takes over and calls ``start_up_over()``: the trainer's stop after the step
(``training/signals.py``), a script's first token or measurement. Data preparation's handlers stand in for the
guard while they run and hand it back after (``data/prepare.py``).

The signal raises ``StartupInterrupted`` where it lands, so every ``finally`` on the way out runs (Hydra's folder
of a run that never started is removed); at the top, the exception is the one line, and the process ends by the
signal there (exit 130 or 143), as Python ends one that Ctrl-C interrupted: a library's exit handler (wandb's,
half started) has nothing to add. A library may catch the exception or turn it
into another: numpy, interrupted while its C module loads, fails its next import with an ImportError. So the
signal is also recorded: any error that ends the script after it is the interruption, said as such, and one that
was swallowed is raised when start-up is over.
"""

from __future__ import annotations

import os
import signal
import sys

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_armed: dict[int, object] = {}  # each stop signal's handler before the guard: put back when start-up is over
_received: int | None = None  # a stop signal that came during start-up


class StartupInterrupted(KeyboardInterrupt):
    """A stop signal before the script's work began: nothing was started."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        by = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name
        super().__init__(f"{_script()}: stopped by {by} while starting, before any work: nothing was started; "
                         f"run the command again")  # fmt: skip


def _script() -> str:
    """The command as the user names it: ``train.py``, ``python -m data``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.endswith(".__main__"):
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def guard_start_up() -> None:
    """From now until ``start_up_over()``, SIGINT and SIGTERM end the script with one line. Call it first."""
    global _received
    if _armed:
        return
    _received = None
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:  # ignored by whoever started it (a background job): kept so
            continue
        try:
            _armed[sig] = signal.signal(sig, _interrupt)
        except ValueError:  # not the main thread: signals are not this code's to take
            return
    if not _armed:
        return
    hook = sys.excepthook

    def say_it(kind, error, traceback) -> None:
        interrupted = error if isinstance(error, StartupInterrupted) else interruption()
        if interrupted is None:
            return hook(kind, error, traceback)
        if _is_main_rank():
            print(interrupted, file=sys.stderr, flush=True)
        _end_by(interrupted.signum)

    sys.excepthook = say_it


def _interrupt(signum: int, frame) -> None:
    global _received
    _received = signum
    raise StartupInterrupted(signum)


def interruption() -> StartupInterrupted | None:
    """The stop signal that came while the script started, as the exception to end it with; None if none came."""
    return StartupInterrupted(_received) if _armed and _received is not None else None


def start_up_over() -> None:
    """The work begins: its own handling of the stop signals takes over (Python's defaults until it does). A
    signal that came during start-up and was swallowed on the way is raised now."""
    if not _armed:
        return
    for sig, previous in _armed.items():
        if signal.getsignal(sig) is _interrupt:
            signal.signal(sig, previous)
    pending = interruption()
    _armed.clear()
    if pending is not None:
        raise pending


def _is_main_rank() -> bool:
    """Under torchrun or srun every rank gets the signal: rank 0 says it."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def _end_by(signum: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)

"""The console of a long run: it may outlive the program reading it.

``python train.py ... | tee log``, then Ctrl-C: the terminal signals tee too, which exits, and the run's next
write to the pipe fails (EPIPE). A run must still finish its step, save and record how it ended, so its
output, once nobody reads it, goes to /dev/null instead of raising. The run's train.log keeps every line, and
its last words (how to continue it) also go to the terminal the command was typed in (``to_the_terminal``):
else the screen would stop at the progress bar, and the user would not know the run saved.
"""

from __future__ import annotations

import os
import sys


class OutlivesItsReader:
    """A text stream whose writes, once the reader at the other end of the pipe is gone, go to /dev/null."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """The stream's descriptor now writes to /dev/null: what its buffer still holds has nowhere to go."""
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:
            self._stream.flush()
        except BrokenPipeError:
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def outlive_the_reader() -> None:
    """stdout and stderr survive the end of whatever reads them (call before logging is configured)."""
    sys.stdout, sys.stderr = OutlivesItsReader(sys.stdout), OutlivesItsReader(sys.stderr)


def to_the_terminal(text: str, stream=None) -> bool:
    """Where ``stream`` (stderr) has lost its reader (``| tee log`` after Ctrl-C), ``text`` on the terminal the
    command was typed in (the process's controlling terminal), so the user sees it; False where the reader is
    there (nothing to do) or there is no terminal (a job with none: train.log has it)."""
    stream = sys.stderr if stream is None else stream
    if not getattr(stream, "reader_gone", False):
        return False
    try:
        with open("/dev/tty", "w") as terminal:
            terminal.write(text.rstrip("\n") + "\n")
    except OSError:
        return False
    return True

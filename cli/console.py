"""The console of a long run: it may outlive the program reading it.

``python train.py ... | tee log``, then Ctrl-C: the terminal signals tee too, which exits, and the run's next
write to the pipe fails (EPIPE). A run must still finish its step, save and record how it ended, so its
output, once nobody reads it, goes to /dev/null instead of raising. The run's train.log keeps every line.
"""

from __future__ import annotations

import os
import sys


class OutlivesItsReader:
    """A text stream whose writes, once the reader at the other end of the pipe is gone, go to /dev/null."""

    def __init__(self, stream) -> None:
        self._stream = stream

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

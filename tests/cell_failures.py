"""A property cell's failures, every one of them: a cell checks many lengths (or prompts), and one that stopped at its
first failure would say nothing of the others. ``CellFailures`` runs each length's checks, keeps every comparison that
fails (which tensor, how many values, the largest error) and every error raised at that length, goes on to the next,
and fails once at the end naming them all: a block wrong at T=2 alone says so, and that T=3..200 hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# The failed comparisons named per length; the rest are counted (a decoding prompt may fail at every position)
SHOWN_PER_LENGTH = 4


class CellFailures:
    """Collects a cell's failures length by length: ``with failures.at(T, "T=5, batch 3"):`` around one length's
    checks, ``failures.compare(...)`` for each tensor, then ``failures.raise_any()``.

    ``subject`` says what the cell is held to (its formula and tolerance); ``counted`` what the keys are, ``key``
    their name in the summary ("lengths", "T"; "prompts", "prompt")."""

    def __init__(self, subject: str, counted: str = "lengths", key: str = "T"):
        self.subject, self.counted, self.key = subject, counted, key
        self.held: list = []  # the keys whose every check held
        self.failed: dict = {}  # key -> (where, [what failed])
        self.first_error: BaseException | None = None  # kept for the traceback: the cause of the cell's failure
        self._found: list[str] | None = None

    @contextlib.contextmanager
    def at(self, key, where: str) -> Iterator[CellFailures]:
        """One length's checks: the comparisons that fail are kept, and an error raised inside (an assertion, a
        shape that does not fit) ends this length's checks, is kept, and the next length runs."""
        self._found = []
        try:
            yield self
        except Exception as err:  # not pytest's skip or exit: those are BaseExceptions and pass through
            self._found.append(f"{type(err).__name__}: {first_line(err)}")
            self.first_error = self.first_error or err
        found, self._found = self._found, None
        if found:
            self.failed[key] = (where, found)
        else:
            self.held.append(key)

    def compare(self, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, tensor: str) -> None:
        """torch.testing.assert_close's test, |got - want| <= atol + rtol |want| everywhere (NaN fails), in one
        expression: its own checks cost more than a decoding step at these sizes. What differs is described only
        where it fails."""
        alike = (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
        if alike and bool(((got - want).abs() <= atol + rtol * want.abs()).all()):
            return
        self.fail(f"{tensor}: {mismatch(got, want, atol, rtol)}")

    def check(self, holds: bool, what: str) -> None:
        """A fact that must hold at this length (a cache's size): ``what`` names it where it does not."""
        if not holds:
            self.fail(what)

    def fail(self, what: str) -> None:
        assert self._found is not None, "compare and check run inside failures.at(...)"
        self._found.append(what)

    def raise_any(self) -> None:
        """Fails naming every length that failed and what failed there, and the lengths that held."""
        if not self.failed:
            return
        failed = ", ".join(str(k) for k in self.failed)
        held = f"{self.key}={', '.join(str(k) for k in self.held)} hold" if self.held else "none holds"
        lines = [f"{self.subject}: fails at {len(self.failed)} of {len(self.failed) + len(self.held)} {self.counted} "
                 f"({self.key}={failed}); {held}"]  # fmt: skip
        for where, found in self.failed.values():
            more = f"; and {len(found) - SHOWN_PER_LENGTH} more" if len(found) > SHOWN_PER_LENGTH else ""
            lines.append(f"  {where}: " + "; ".join(found[:SHOWN_PER_LENGTH]) + more)
        raise AssertionError("\n".join(lines)) from self.first_error


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def mismatch(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> str:
    """What differs between two tensors held to |got - want| <= atol + rtol |want|, in one line."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} where {tuple(want.shape)} is expected"
    if (got.dtype, got.device) != (want.dtype, want.device):
        return f"{got.dtype} on {got.device} where {want.dtype} on {want.device} is expected"
    got, want = got.detach().cpu(), want.detach().cpu()
    off = ~((got - want).abs() <= atol + rtol * want.abs())  # compare's test, in the tensors' own precision
    error = (got.double() - want.double()).abs().nan_to_num(nan=-1.0)  # NaN: counted apart, never the largest
    error = torch.where(off, error, -1.0)  # the largest error of the values off
    nan = f" ({int(got.isnan().sum())} NaN)" if got.isnan().any() else ""
    largest = error.flatten().argmax().item()
    if error.flatten()[largest] < 0:
        return f"{int(off.sum())} of {off.numel()} values off{nan}"
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(largest), error.shape))
    allowed = f"{atol:.2e}" + (f" + {rtol:g} |want|" if rtol else "")
    return (f"{int(off.sum())} of {off.numel()} values off{nan}, the largest |got - want| "
            f"{error.flatten()[largest].item():.2e} at {at} (allowed {allowed})")

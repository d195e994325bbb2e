"""Generated tokens compared across code paths by the property, not by a bit pattern.

Two paths (batched and alone, cached and not, eager and compiled, two layouts) compute the
same logits up to float round-off, and which bits they get depends on the library's kernel
choice (the CPU, its vector units, buffer alignment). Their tokens must agree wherever
round-off cannot flip the choice. ``record_choices`` records, for each generated token, the
logits, the uniform numbers drawn and the tokens chosen. ``assert_same_choices`` then checks
each row until its histories part: the same uniform numbers (exactly: the same generator
streams), logits equal within ``atol``, and the same token, or else a near-tie: each path's
token is what ``choose`` gives for that path's own logits, and the two logits are within
``atol``, so a round-off-sized change flips the choice. A wrong mask, a mixed-up row or
generator, or a changed formula moves the logits far more than round-off and fails, naming
the row and the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import model.decoding.generation as generation

ATOL = 1e-4  # float32 logits of two code paths: the stated tolerance of these comparisons


@dataclass
class Step:
    logits: torch.Tensor  # (B, V) float32 on the CPU
    u: torch.Tensor | None  # (B,) the uniform numbers drawn; None when greedy
    tokens: list[int]


@dataclass
class Trace:
    """One generation: its sampling settings and one Step per generated token."""

    settings: tuple  # (temperature, top_k, top_p)
    steps: list[Step] = field(default_factory=list)

    def tokens(self, row: int = 0) -> list[int]:
        return [step.tokens[row] for step in self.steps]


class Recorder:
    """Records every choice generation makes, into a new Trace at each ``start()``."""

    def __init__(self) -> None:
        self.traces: list[Trace] = []

    def start(self) -> None:
        self.traces.append(Trace(settings=()))

    def record(self, logits, u, settings, tokens) -> None:
        trace = self.traces[-1]
        assert trace.settings in ((), settings), "one generation, one set of sampling settings"
        trace.settings = settings
        u_cpu = None if u is None else u.detach().cpu().clone()
        trace.steps.append(Step(logits.detach().float().cpu().clone(), u_cpu, tokens.tolist()))


def record_choices(monkeypatch) -> Recorder:
    """Record what ``model.decoding.generation.choose`` is given and gives; call ``start()`` before each generation."""
    real_choose = generation.choose
    recorder = Recorder()

    def recording_choose(logits, u, temperature, top_k, top_p):
        tokens = real_choose(logits, u, temperature, top_k, top_p)
        recorder.record(logits, u, (temperature, top_k, top_p), tokens)
        return tokens

    monkeypatch.setattr(generation, "choose", recording_choose)
    return recorder


def _choice(trace: Trace, logits: torch.Tensor, u: torch.Tensor | None) -> int:
    """``choose`` for one row alone."""
    return int(generation.choose(logits.unsqueeze(0), None if u is None else u.reshape(1), *trace.settings)[0])


def assert_same_choices(got: Trace, expected: Trace, rows: list[tuple[int, int]] | None = None,
                        atol: float = ATOL) -> int:  # fmt: skip
    """``got`` chose ``expected``'s tokens up to round-off near-ties; returns how many rows parted at one.

    ``rows`` pairs a row of ``got`` with a row of ``expected`` (default: row i with row i).
    """
    assert got.settings == expected.settings, f"sampling settings {got.settings} vs {expected.settings}"
    rows = rows if rows is not None else [(i, i) for i in range(len(got.steps[0].tokens))]
    parted = 0
    for a, b in rows:
        for t, (sa, sb) in enumerate(zip(got.steps, expected.steps)):
            ua = None if sa.u is None else sa.u[a]
            ub = None if sb.u is None else sb.u[b]
            assert (ua is None and ub is None) or torch.equal(ua, ub), f"row {a}, token {t}: different random draws"
            diff = (sa.logits[a] - sb.logits[b]).abs().max().item()
            assert diff <= atol, f"row {a}, token {t}: logits differ by {diff:.3g}, more than round-off ({atol})"
            ta, tb = sa.tokens[a], sb.tokens[b]
            if ta == tb:
                continue
            assert _choice(got, sa.logits[a], ua) == ta and _choice(expected, sb.logits[b], ub) == tb, (
                f"row {a}, token {t}: tokens {ta} vs {tb} are not the choices of their own logits"
            )
            parted += 1  # a near-tie: past it the two histories differ and are not compared
            break
    if not parted:  # the same tokens throughout: both stopped together
        assert len(got.steps) == len(expected.steps), f"{len(got.steps)} tokens generated vs {len(expected.steps)}"
    return parted

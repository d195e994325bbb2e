"""When a bench.py figure is not to be trusted: timings far apart within a pass or across passes, and
passes timed while other processes used the machine's cores (common/machine_load.py)."""

from __future__ import annotations

import math

from common.machine_load import cores, is_busy

# Measurements of one cell this far apart (slowest / fastest) make it noisy: a 2.5x outlier is, whatever the
# interquartile range says.
NOISY_RANGE = 1.5
BUSY_MARK = "†"  # a figure timed while other processes used a share of the machine's cores


def noise_warnings(runs: list[dict], step_name: str) -> str:
    """The cell's noisy measurements, each with its figures (``measurement_noise``)."""
    notes = []
    for what, name in (("forward", "forward"), ("step", step_name)):
        parts = measurement_noise(runs, what)
        if parts:
            notes.append(f"{name}: {', '.join(parts)}, a noisy measurement")
    return "; ".join(notes)


def measurement_noise(runs: list[dict], what: str) -> list[str]:
    """Why one measurement (``forward`` or ``step``) of a cell is noisy, over its passes ([] when it is not): an
    interquartile range past 10% of the median (torch.utils.benchmark's own threshold) in a pass, a slowest
    timing past NOISY_RANGE x the fastest in a pass (an outlier the interquartile range hides), or pass medians
    that far apart (a pass slowed by a shared machine)."""
    parts = []
    noisy = [r[f"{what}_spread"] for r in runs if r[f"{what}_spread"] > 0.1]
    if noisy:
        figures = ", ".join(f"{spread:.0%}" for spread in noisy)
        parts.append(f"interquartile range {figures} of the median in {len(noisy)} of {len(runs)} pass(es)")
    ranges = [r[f"{what}_range"] for r in runs if r.get(f"{what}_range", 1.0) > NOISY_RANGE]
    if ranges:
        figures = ", ".join(f"{spread:.1f}x" for spread in ranges)
        parts.append(f"slowest timing {figures} the fastest in {len(ranges)} of {len(runs)} pass(es)")
    medians = [r[f"{what}_ms"] for r in runs if r.get(f"{what}_ms", math.nan) == r.get(f"{what}_ms", math.nan)]
    if len(medians) > 1 and max(medians) > NOISY_RANGE * min(medians):
        parts.append(f"pass medians {ms_text(min(medians))}-{ms_text(max(medians))} ms "
                     f"({max(medians) / min(medians):.1f}x)")  # fmt: skip
    return parts


def busy_note(runs: list[dict]) -> str:
    """The passes timed on a busy machine (other processes used a share of its cores: common/machine_load.py),
    with what they used; "" where none was. A cell slowed as a whole has no spread to show it: this says it."""
    busy = [r["others_cores"] for r in runs if is_busy(r.get("others_cores"))]
    if not busy:
        return ""
    used = f"{min(busy):.1f}" if min(busy) == max(busy) else f"{min(busy):.1f}-{max(busy):.1f}"
    return (f"a busy machine in {len(busy)} of {len(runs)} pass(es) (other processes used {used} of {cores()} "
            f"cores): not this cell's own speed")  # fmt: skip


def max_load(runs: list[dict]) -> float | None:
    """The most cores other processes used in any of the cell's passes (None where the system does not say)."""
    loads = [r["others_cores"] for r in runs if r.get("others_cores") is not None]
    return max(loads) if loads else None


def joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def ms_text(ms: float) -> str:
    """Milliseconds as a reader takes them in: three significant digits, whole numbers from 100 up (1,583, not
    1.58e+03)."""
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"

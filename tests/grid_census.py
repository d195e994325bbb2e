"""How many cells of the property grids (tests/test_attention_properties.py) exercise each registered value, so that
none can lose cells unseen: the grids are generated from the registries and turn layouts, kernels, key/value heads and
windows entry by entry, so an entry added or changed can move or take another value's cells.

A value is ``"<axis> <name>"``: each registered layout, kernel, position encoding, score modification and mask, each
other option of ``AttentionSpec`` (those with cells of their own, ``options_of_their_own``, those a combination sets,
and those proved elsewhere, whose count is 0) and each ``ENCODINGS`` entry. Its count is the cells that
exercise it, in all, and broken down by the other axes that the grids turn (``"layout mla"``, ``"kernel sdpa"``,
``"heads gqa"``, ``"mask window"``), in the default run (the cells it runs, not those marked deep) and in the
``--deep`` one. A cell is one set of a test's parameters: the device and the decoding step (eager, static) multiply
every cell alike and are not counted, so the counts are the same on every machine. Counting builds no block."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from model.attention import AttentionSpec
from model.attention.options import option_fields
from model.registry import KERNELS, MASKS, MIXERS, MODIFICATIONS, POSITIONS

TIERS = ("default", "deep")
ALL = "cells"  # a value's count in all; the other parts of its count are "<axis> <name>"


def other_options() -> list[str]:
    """The options that are no axis of their own (not the key/value heads, the position, a mask's or a modification's
    option), in AttentionSpec's order."""
    axes = {"n_kv_head", "position", *(m.field for m in MASKS.values()), *(m.field for m in MODIFICATIONS.values())}
    return [name for name in option_fields() if name not in axes]


@dataclass(frozen=True)
class Cell:
    """What one cell exercises: its layer, its kernel, its key/value heads, the options it sets (beyond its layout's
    config file) and the ENCODINGS entry it holds, if any."""

    layout: str
    kernel: str
    n_head: int
    n_kv: int | None
    options: dict = field(default_factory=dict)
    encoding: str | None = None

    @property
    def heads(self) -> str:
        """Multi-head (a layer without key/value heads of its own too), grouped or multi-query."""
        if self.n_kv is None or self.n_kv == self.n_head:
            return "mha"
        return "mqa" if self.n_kv == 1 else "gqa"

    def masks(self) -> list[str]:
        """The registered masks the cell applies (a mask without an option, causal, always)."""
        return [name for name, mask in MASKS.items() if mask.field is None or self.options.get(mask.field) is not None]


def registered_values(encodings: Iterable[str]) -> list[str]:
    """Every value whose cells are counted, axis by axis, in the registries' order."""
    return [*(f"layout {name}" for name in MIXERS), *(f"kernel {name}" for name in KERNELS),
            *(f"position {name}" for name in POSITIONS), *(f"modification {name}" for name in MODIFICATIONS),
            *(f"mask {name}" for name in MASKS), *(f"option {name}" for name in other_options()),
            *(f"encoding {name}" for name in encodings)]  # fmt: skip


def values_of(cell: Cell) -> list[str]:
    """The values one cell exercises."""
    options = cell.options
    return [f"layout {cell.layout}", f"kernel {cell.kernel}",
            f"position {options.get('position', AttentionSpec.position)}",
            *(f"modification {name}" for name, mod in MODIFICATIONS.items()
              if mod.field in options and mod.used(options[mod.field])),
            *(f"mask {name}" for name in cell.masks()),
            *(f"option {name}" for name in other_options() if name in options),
            *([f"encoding {cell.encoding}"] if cell.encoding else [])]  # fmt: skip


def parts_of(cell: Cell) -> list[str]:
    """The parts of a count a cell adds to, besides ``ALL``: the axes the grids turn (a mask with an option only: a
    mask without one is in every cell)."""
    return [f"layout {cell.layout}", f"kernel {cell.kernel}", f"heads {cell.heads}",
            *(f"mask {name}" for name in cell.masks() if MASKS[name].field is not None)]  # fmt: skip


def tally(cells: Iterable[Cell]) -> dict[str, Counter]:
    """{value: {ALL or a part: cells}}: each value's cells in all, and by each other axis (not its own)."""
    counts: dict[str, Counter] = {}
    for cell in cells:
        for value in values_of(cell):
            axis = value.split()[0]
            count = counts.setdefault(value, Counter())
            count[ALL] += 1
            count.update(part for part in parts_of(cell) if part.split()[0] != axis)
    return counts


def shortfalls(counts: dict[str, dict[str, Counter]], floors: dict, values: list[str]) -> list[str]:
    """One line per value whose cells fell below its floor in a tier (``counts``: {tier: tally}; ``floors``: {value:
    {part: (default, deep)}}), that has no floor, or whose floor names a value no longer registered."""
    lines = []
    for value in values:
        if value not in floors:
            lines.append(f"{value}: no floor (a value registered since the table was written)")
            continue
        for t, tier in enumerate(TIERS):
            now = counts[tier].get(value, Counter())
            lost = [f"{part} {now[part]} (floor {floor[t]})" for part, floor in floors[value].items()
                    if now[part] < floor[t]]  # fmt: skip
            if lost:
                lines.append(f"{value} lost cells in the {tier} run: " + ", ".join(lost))
    lines += [f"{value}: a floor, but no such value is registered (renamed or removed)" for value in floors
              if value not in values]  # fmt: skip
    return lines


def floors_source(counts: dict[str, dict[str, Counter]], values: list[str]) -> str:
    """The text of ``FLOORS`` (tests/grid_floors.py) for these counts: each value's (default, deep) cells in all and
    by each part it meets in either run."""
    lines = ["FLOORS = {"]
    for value in values:
        parts = [ALL] + sorted({p for tier in TIERS for p in counts[tier].get(value, {}) if p != ALL}, key=part_order)
        default, deep = (counts[tier].get(value, Counter()) for tier in TIERS)
        items = [f'"{part}": ({default[part]}, {deep[part]})' for part in parts]
        one_line = f'    "{value}": {{' + ", ".join(items) + "},"
        if len(one_line) <= 120:
            lines.append(one_line)
            continue
        lines.append(f'    "{value}": {{')
        line = " " * 8
        for item in items:
            if len(line) + len(item) + 2 > 120:
                lines.append(line.rstrip())
                line = " " * 8
            line += item + ", "
        lines += [line.rstrip(), "    },"]
    return "\n".join(lines + ["}"]) + "\n"


def part_order(part: str) -> tuple:
    """Parts by axis (layouts, kernels, heads, masks), then in their registry's order."""
    axis, name = part.split(maxsplit=1)
    order = {"layout": list(MIXERS), "kernel": list(KERNELS), "heads": ["mha", "gqa", "mqa"],
             "mask": list(MASKS)}  # fmt: skip
    return list(order).index(axis), order[axis].index(name) if name in order[axis] else len(order[axis]), name

"""bench.md of --mode block and --mode gpt: a row per cell, the options some cell sets as
columns, and the warnings (noisy, busy, forward only)."""

from __future__ import annotations

from analysis.tables import markdown_table
from common.machine_load import is_busy
from measuring.cells import OPTION_DEFAULTS, cell_label, varied
from measuring.noise import BUSY_MARK


def option_columns(rows: list[dict]) -> list[str]:
    """The issue-30 options some row sets (each a column of the table): position, qk_norm, softcap, ..."""
    return [k for k in OPTION_DEFAULTS if any(r.get(k, OPTION_DEFAULTS[k]) != OPTION_DEFAULTS[k] for r in rows)]


def axis_text(r: dict, axis: str) -> str:
    """A key/value-heads or window cell: its value, none (every key), or - (a latent has no key/value heads)."""
    if axis == "kv_heads" and r.get("kv_latent") is not None:
        return "-"
    return str(r[axis] or "none")


def option_text(value) -> str:
    """A table cell of an option: on/off for a switch, the value otherwise ("-" where unset)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def impossible(r: dict) -> bool:
    """A block measured faster with its backward than without: not a timing (too small a shape, or noise), shown
    as such in the table and left out of the figure, never ranked."""
    return r["mode"] == "block" and r["forward_ms"] > r["step_ms"]


def markdown(rows: list[dict], title: str, step_name: str, repeats: int) -> str:
    axes, options = [a for a in varied(rows) if a != "position"], option_columns(rows)
    header = ["layout", "kernel", *(("kv heads" if a == "kv_heads" else "window") for a in axes),
              *(o.replace("_", " ") for o in options), "compile", "seq_len", "forward ms",
              f"{step_name} ms"]  # fmt: skip
    header += ["range over passes"] if repeats > 1 else []  # no range to show from one pass
    header += ["tokens/s", "peak MB", "SDPA backend", "compile s"]
    table = []
    for r in rows:
        step = "-" if r["step_ms"] != r["step_ms"] else f"{r['step_ms']:.3f}"  # NaN: not on this device
        step = f"{step} (invalid)" if impossible(r) else step
        cells = [r["layout"], r["kernel"], *(axis_text(r, a) for a in axes),
                 *(option_text(r.get(o, OPTION_DEFAULTS[o])) for o in options), r["compile"], str(r["seq_len"]),
                 f"{r['forward_ms']:.3f}", step]  # fmt: skip
        cells += ([step if step == "-" else f"{r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}"]
                  if repeats > 1 else [])  # fmt: skip
        speed = "-" if r["tokens_per_sec"] != r["tokens_per_sec"] else f"{r['tokens_per_sec']:,.0f}"
        speed = "invalid" if impossible(r) else speed
        speed += f" {BUSY_MARK}" if is_busy(r.get("others_cores")) and speed != "-" else ""
        cells += [speed, "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:,.0f}",
                  r["sdpa_backend"], "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"]  # fmt: skip
        table.append(cells)
    right = [i >= 3 + len(axes) + len(options) and name != "SDPA backend" for i, name in enumerate(header)]
    lines = [title, "", markdown_table(header, table, right)]
    if any(is_busy(r.get("others_cores")) for r in rows):
        lines += ["", f"{BUSY_MARK} timed on a busy machine (other processes used a share of the cores: the warnings "
                      f"say how much): not the cell's own speed"]  # fmt: skip
    notes = []
    for r in rows:
        cell = f"{cell_label(r, varied(rows))}, {r['compile']}, seq {r['seq_len']}"
        if r["step_ms"] != r["step_ms"]:
            notes.append(f"- {cell}: forward only (FlexAttention has no backward on a CPU)")
        if r["warnings"]:
            notes.append(f"- {cell}: {r['warnings']}")
        if impossible(r):
            notes.append(f"- {cell}: forward ({r['forward_ms']:.3f} ms) measured slower than forward+backward "
                         f"({r['step_ms']:.3f} ms): too small or too noisy to time, so its step time and tokens/s are "
                         f"invalid and bench.png leaves it out; use a larger shape")  # fmt: skip
    if notes:
        lines += ["", "Benchmark warnings:", *notes]
    return "\n".join(lines)

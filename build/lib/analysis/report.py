"""Per-run summary rows, the comparability check, and the loss-difference flags."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from analysis.runs import Run, warmup_steps

FINAL_FRACTION = 0.1  # steps averaged into the final train loss
FLAG_SIGMAS = 3.0

COLUMNS = [
    ("layout", "layout"), ("kernel", "kernel"), ("seed", "seed"), ("params", "params"),
    ("final_train_loss", "final train loss"), ("best_val_loss", "best val loss"),
    ("best_val_bpb", "val bpb"), ("tokens_per_sec", "tokens/s"), ("step_ms", "step ms"),
    ("peak_mem_mb", "peak mem MB"), ("mfu", "MFU"), ("compile_s", "compile s"),
    ("time_to_target_s", "time to target s"),
    ("flag", "flag"),
]  # fmt: skip


def check_comparable(runs: list[Run], force: bool = False) -> None:
    """Refuse to compare runs trained on different data or token budgets, unless forced."""
    problems = []
    runs = [r for r in runs if r.failure is None]  # a failed run has no data or budget to compare
    for what, key in (("data", lambda r: r.info["data_dir"]), ("token budgets", lambda r: r.token_budget)):
        values = {key(r) for r in runs}
        if len(values) > 1:
            problems.append(f"{what} differ: " + ", ".join(f"{r.path.name}={key(r)}" for r in runs))
    if problems and not force:
        raise ValueError(
            "these runs are not comparable: " + "; ".join(problems) + ". Compare runs of one sweep, "
            "or pass --force to compare them anyway"
        )


def default_target(runs: list[Run]) -> float | None:
    """The loss every run reached: the highest of the runs' best validation losses."""
    bests = [min(e["val/loss"] for e in r.evals) for r in runs if r.evals and r.failure is None]
    return max(bests) if bests else None


def failed_row(run: Run) -> dict:
    row = {key: None for key, _ in COLUMNS}
    row.update(layout=run.layout, kernel=run.kernel, seed=run.seed, final_train_loss_se=None,
               flag=f"FAILED: {run.failure}")  # fmt: skip
    return row


def summarize(run: Run, target: float | None) -> dict:
    if run.failure is not None:
        return failed_row(run)
    steps, evals = run.steps, run.evals
    steady = steps[warmup_steps(len(steps)) :] or steps
    final = steps[-max(1, int(len(steps) * FINAL_FRACTION)) :]
    losses = [s["train/loss"] for s in final]
    best = min(evals, key=lambda e: e["val/loss"]) if evals else None
    memory = [s.get("perf/peak_mem_mb", s.get("perf/max_rss_mb")) for s in steps]
    mfu = [s["perf/mfu"] for s in steady if "perf/mfu" in s]
    return {
        "layout": run.layout,
        "kernel": run.kernel,
        "seed": run.seed,
        "params": run.info["params"],
        "final_train_loss": statistics.fmean(losses) if losses else math.nan,
        # the standard error of that mean: how much batch-to-batch noise it carries
        "final_train_loss_se": statistics.stdev(losses) / math.sqrt(len(losses)) if len(losses) > 1 else 0.0,
        "best_val_loss": best["val/loss"] if best else math.nan,
        "best_val_bpb": best["val/bpb"] if best else math.nan,
        "tokens_per_sec": statistics.median(s["perf/tokens_per_sec"] for s in steady) if steady else math.nan,
        "step_ms": statistics.median(s["perf/step_ms"] for s in steady) if steady else math.nan,
        "peak_mem_mb": max((m for m in memory if m is not None), default=math.nan),
        "mfu": statistics.median(mfu) if mfu else None,
        "compile_s": run.compile_seconds,
        "time_to_target_s": time_to_target(run, target),
        "flag": "",
    }


def time_to_target(run: Run, target: float | None) -> float | None:
    """Training seconds until val/loss first reached target (``Run.training_seconds``: evaluation,
    compilation and the warm-up steps' excess excluded)."""
    if target is None:
        return None
    by_step = run.training_seconds()
    reached = next((e["step"] for e in run.evals if e["val/loss"] <= target), None)
    return by_step.get(reached) if reached is not None else None


def flag_loss_differences(runs: list[Run], rows: list[dict]) -> str:
    """Mark variants whose loss differs from the others' median by more than the noise; say how."""
    by_variant: dict[str, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        by_variant[run.variant].append(i)
    replicated = [ix for ix in by_variant.values() if len(ix) > 1]
    if replicated:  # several seeds of a variant: the noise is their spread
        metric = "best_val_loss"
        spreads = [statistics.stdev(rows[i][metric] for i in ix) for ix in replicated]
        noise = math.sqrt(statistics.fmean(s * s for s in spreads))
        how = f"seed-to-seed spread of the best val loss ({len(replicated)} variant(s) with several runs)"
    else:  # one run per variant: the noise of each final train loss from its own steps
        metric = "final_train_loss"
        noise = math.sqrt(2) * statistics.median(r["final_train_loss_se"] for r in rows)
        how = (
            "batch noise of the final train loss (no variant has several seeds; "
            "add seeds with `-m ... trainer.seed=1,2,3` to measure run-to-run noise)"
        )
    means = {v: statistics.fmean(rows[i][metric] for i in ix) for v, ix in by_variant.items()}
    center = statistics.median(means.values())
    limit = FLAG_SIGMAS * max(noise, 1e-12)
    for variant, ix in by_variant.items():
        diff = means[variant] - center
        if abs(diff) > limit:
            for i in ix:
                rows[i]["flag"] = f"{metric} {diff:+.4f} vs median"
    return f"{metric} differing from the median of the variants by more than {FLAG_SIGMAS:g} x {noise:.4f} ({how})"


def build_rows(runs: list[Run], target: float | None) -> tuple[list[dict], str]:
    rows = [summarize(run, target) for run in runs]
    finished = [i for i, run in enumerate(runs) if run.failure is None]
    if len(finished) > 1:
        rule = flag_loss_differences([runs[i] for i in finished], [rows[i] for i in finished])
    else:
        rule = "fewer than two finished runs: nothing to compare"
    return rows, rule


def format_value(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key == "params":
        return f"{value:,}"
    if key == "mfu":
        return f"{100 * value:.1f}%"
    if key in ("tokens_per_sec", "peak_mem_mb"):
        return f"{value:,.0f}"
    if key in ("step_ms", "time_to_target_s", "compile_s"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def markdown_table(rows: list[dict]) -> str:
    align = [" --- " if key in ("layout", "kernel", "flag") else " ---: " for key, _ in COLUMNS]
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_value(k, row[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)

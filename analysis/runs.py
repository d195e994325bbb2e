"""A finished (or running) run directory: its ``run.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    path: Path
    info: dict  # run.json: the resolved config plus params, device, data directory
    steps: list[dict]  # per-step records (train/loss, perf/...)
    evals: list[dict]  # evaluation records (val/loss, val/bpb)
    failure: str | None = None  # why the run could not finish (failure.json), e.g. out of memory

    @property
    def layout(self) -> str:
        return self.info["model"]["attention"]

    @property
    def kernel(self) -> str:
        return self.info["model"]["kernel"]

    @property
    def variant(self) -> str:
        return f"{self.layout}/{self.kernel}"

    @property
    def seed(self) -> int:
        return self.info["trainer"]["seed"]

    def steady_step_ms(self) -> float:
        """The median step time after the warm-up steps."""
        steady = self.steps[warmup_steps(len(self.steps)) :] or self.steps
        return statistics.median(s["perf/step_ms"] for s in steady) if steady else math.nan

    def training_seconds(self) -> dict[int, float]:
        """Cumulative training time at each step: the one definition every report and plot uses.

        Compilation is timed apart (``perf/compile_s``) and never in a step; the first
        ``warmup_steps`` steps (allocator, caches, autotuning) count as a steady-state step
        each, so a slow start changes no time-to-target beyond those steps' share.
        """
        n_warmup, typical = warmup_steps(len(self.steps)), self.steady_step_ms()
        elapsed, at = 0.0, {}
        for i, s in enumerate(self.steps):
            elapsed += (typical if i < n_warmup else s["perf/step_ms"]) / 1e3
            at[s["step"]] = elapsed
        return at

    @property
    def compile_seconds(self) -> float | None:
        return self.info.get("compile_s")

    @property
    def token_budget(self) -> int:
        return self.info["trainer"]["max_steps"] * self.info["tokens_per_step"]


WARMUP_FRACTION = 0.1  # steps left out of steady-state speed: allocator, caches, autotuning
MAX_WARMUP_STEPS = 20


def warmup_steps(n_steps: int) -> int:
    return min(MAX_WARMUP_STEPS, int(n_steps * WARMUP_FRACTION))


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file; a damaged line (a run killed mid-write) is skipped with a warning."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            warn(f"{path}:{number} is not a JSON record (cut by a kill?): skipped that line")
    return records


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def load_run(path: Path) -> Run:
    metrics = path / "metrics.jsonl"
    records = read_jsonl(metrics) if metrics.exists() else []
    # A resumed run may log a step twice (before and after the interruption): keep the latest.
    steps = {r["step"]: r for r in records if "train/loss" in r}
    evals = {r["step"]: r for r in records if "val/loss" in r}
    info = json.loads((path / "run.json").read_text())
    info["model"]["attention"], info["model"]["kernel"], info["trainer"]["seed"]  # noqa: B018  (KeyError: damaged)
    compile_s = [r["perf/compile_s"] for r in records if "perf/compile_s" in r]
    if compile_s:
        info["compile_s"] = compile_s[-1]
    failure = json.loads((path / "failure.json").read_text())["reason"] if (path / "failure.json").exists() else None
    return Run(path, info, [steps[s] for s in sorted(steps)], [evals[s] for s in sorted(evals)], failure)


def natural_key(path: Path) -> list:
    """Sort "2_wrapper" before "10_fused_qkv": a multirun's job numbers in order."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Run directories given directly, or found below a multirun directory, in a stable order."""
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{given} does not exist; give run directories or a multirun directory")
        if (path / "run.json").exists():
            found.append(path)
        else:
            below = [p.parent for p in path.rglob("run.json")
                     if (p.parent / "metrics.jsonl").exists() or (p.parent / "failure.json").exists()]  # fmt: skip
            found += sorted(below, key=natural_key)
    if not found:
        raise ValueError(
            f"no runs found in {', '.join(map(str, paths))}: a run directory holds run.json and "
            f"metrics.jsonl (written by train.py); point at run directories or a multirun directory"
        )
    runs = []
    for path in dict.fromkeys(found):
        try:
            runs.append(load_run(path))
        except (json.JSONDecodeError, KeyError, TypeError, OSError) as err:
            warn(f"skipped {path}: its run.json is damaged ({type(err).__name__}: {err})")
    if not runs:
        raise ValueError(f"every run found in {', '.join(map(str, paths))} is damaged; nothing to compare")
    return runs

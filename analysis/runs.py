"""A finished (or running) run directory: its ``run.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    path: Path
    info: dict  # run.json: the resolved config plus params, device, data directory
    steps: list[dict]  # per-step records (train/loss, perf/...)
    evals: list[dict]  # evaluation records (val/loss, val/bpb)

    @property
    def layout(self) -> str:
        return self.info["attention"]["layout"]

    @property
    def kernel(self) -> str:
        return self.info["attention"]["kernel"]

    @property
    def variant(self) -> str:
        return f"{self.layout}/{self.kernel}"

    @property
    def seed(self) -> int:
        return self.info["trainer"]["seed"]

    @property
    def token_budget(self) -> int:
        return self.info["trainer"]["max_steps"] * self.info["tokens_per_step"]


def load_run(path: Path) -> Run:
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line]
    # A resumed run may log a step twice (before and after the interruption): keep the latest.
    steps = {r["step"]: r for r in records if "train/loss" in r}
    evals = {r["step"]: r for r in records if "val/loss" in r}
    return Run(path, json.loads((path / "run.json").read_text()),
               [steps[s] for s in sorted(steps)], [evals[s] for s in sorted(evals)])  # fmt: skip


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
            below = [p.parent for p in path.rglob("run.json") if (p.parent / "metrics.jsonl").exists()]
            found += sorted(below, key=natural_key)
    if not found:
        raise ValueError(
            f"no runs found in {', '.join(map(str, paths))}: a run directory holds run.json and "
            f"metrics.jsonl (written by train.py); point at run directories or a multirun directory"
        )
    return [load_run(p) for p in dict.fromkeys(found)]

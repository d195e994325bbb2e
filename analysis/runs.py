"""A finished (or running) run directory: its ``run.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
import statistics
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from common.optim_label import settings, training_label
from common.run_files import FAILURE, METRICS, OWNER, PROFILE, PROFILE_SUMMARY, RUN_INFO, directory_in_use
from common.warmup import MAX_WARMUP_STEPS, WARMUP_FRACTION
from model.config import GPTConfig, attention_label, kernel_option, schedule_text
from model.registry import MIXERS

NOT_THE_FUNCTION = ("label", "layout", "implementation")  # GPTConfig reuse kinds that leave the numbers alone
# A field a run.json lacks (older runs) had these.
GPT_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(GPTConfig)}


def hashable(value):
    """A field's value as a key: a mapping (a schedule's layer kinds) as its sorted JSON, others as they are."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


@dataclass
class Run:
    path: Path
    info: dict  # run.json: the resolved config plus params, device, data directory
    steps: list[dict]  # per-step records (train/loss, perf/...)
    evals: list[dict]  # evaluation records (val/loss, val/bpb)
    failure: str | None = None  # why the run could not finish (failure.json), e.g. out of memory
    profile: dict | None = None  # profile/time_by_kind.json, written by trainer.profile=true
    shown: tuple[str, ...] = ()  # axes its label spells even at their default: those the compared runs vary

    @property
    def layout(self) -> str:
        return self.info["model"]["attention"]

    @property
    def kernel(self) -> str:
        return self.info["model"]["kernel"]

    @property
    def kernel_option(self) -> str:
        """The kernel as ``kernel=`` spells it: ``sdpa_flash`` for SDPA held to flash."""
        return kernel_option(self.info["model"])

    @property
    def variant(self) -> str:
        """The run's label, as its directory and wandb name spell it: ``wrapper-sdpa-kv2`` (attention_label), with the
        optimizer and schedule where they are not AdamW and cosine (``fused_qkv-sdpa-muon_qkv``: training_label)."""
        trained = training_label(self.info.get("optim"))
        return attention_label(self.info["model"], show=self.shown) + (f"-{trained}" if trained else "")

    @property
    def optimizer(self) -> tuple:
        """How the run was optimised, as far as it decides the steps: the optimizer and schedule (their label), and
        under Muon as stored the layout too (each layout stores other matrices: another optimizer in effect)."""
        optim = settings(self.info.get("optim"))
        as_stored = optim["name"] == "muon" and optim["muon_split"] == "as_stored"
        return training_label(optim), self.layout if as_stored else None

    @property
    def schedule(self) -> str | None:
        """A schedule of layers as its preset and kinds (``kimi_linear: KKKM, K=kda, M=mla/sdpa``,
        ``model.config.schedule_text``): its label leads with the model's layout and kernel, which some of its
        layers may not run. None for a model whose layers are alike."""
        return schedule_text(self.info["model"], (self.info.get("logger") or {}).get("preset"))

    @property
    def function(self) -> tuple:
        """What the run's model computes, apart from how (layout of one function, kernel, backend) and its name:
        the model fields whose change changes the numbers (``metadata["reuse"]`` in ``GPTConfig``), with the
        layout's function (attention=mla's latent is another function than the three layouts of multi-head
        attention). Runs of one function should reach the same loss for a seed."""
        model = self.info["model"]
        layout = MIXERS.get(model.get("attention"))
        same = (f.name for f in fields(GPTConfig) if f.metadata.get("reuse") not in NOT_THE_FUNCTION)
        return (layout.function if layout else model.get("attention"),
                *((name, hashable(model.get(name, GPT_DEFAULTS[name]))) for name in same))  # fmt: skip

    @property
    def seed(self) -> int:
        return self.info["trainer"]["seed"]

    def steady_steps(self) -> list[dict]:
        """The steps that speed figures use: after the warm-up, not slowed by the profiler, and timed (a record
        without its times, hand-edited or cut, counts for the losses only)."""
        timed = [s for s in self.steps if is_number(s.get("perf/step_ms")) and is_number(s.get("perf/tokens_per_sec"))]
        steady = [s for s in timed[warmup_steps(len(timed)) :] if not s.get("perf/profiled")]
        return steady or [s for s in timed if not s.get("perf/profiled")] or timed

    def steady_step_ms(self) -> float:
        """The median step time of the steady steps."""
        steady = self.steady_steps()
        return statistics.median(s["perf/step_ms"] for s in steady) if steady else math.nan

    def training_seconds(self) -> dict[int, float]:
        """Cumulative training time at each step: the one definition every report and plot uses.

        Compilation is timed apart (``perf/compile_s``) and never in a step; the first
        ``warmup_steps`` steps (allocator, caches, autotuning) and the profiled steps count as a
        steady-state step each, so a slow start changes no time-to-target beyond those steps' share.
        """
        n_warmup, typical = warmup_steps(len(self.steps)), self.steady_step_ms()
        elapsed, at = 0.0, {}
        for i, s in enumerate(self.steps):
            timed = is_number(s.get("perf/step_ms")) and not s.get("perf/profiled")
            elapsed += (s["perf/step_ms"] if timed and i >= n_warmup else typical) / 1e3
            at[s["step"]] = elapsed
        return at

    @property
    def last_step(self) -> int:
        return self.steps[-1]["step"] if self.steps else 0

    @functools.cached_property
    def state(self) -> str:
        """finished | running | stopped (by a signal or trainer.stop_at_step) | killed (it says running, but no
        process holds its directory) | failed. Runs written before run.json kept a status are judged by steps.
        Read once: every figure of a report describes the run at the same moment."""
        if self.failure is not None:
            return "failed"
        status = self.info.get("status")
        if status is None:
            return "finished" if self.last_step >= self.info["trainer"]["max_steps"] else "stopped"
        if status == "running":
            return "running" if self.in_use() else "killed"
        return {"interrupted": "stopped"}.get(status, status)

    def in_use(self) -> bool:
        """Whether a process writes the run now (it holds the owner file's lock); an owner file that is not a
        regular file is never opened (opening a named pipe waits for a writer)."""
        owner = self.path / OWNER
        return is_regular(owner) and directory_in_use(self.path)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def active_spans(self) -> list[tuple[str, str, float, float]]:
        """(host, device, start, end) of each process that ran this run; an open span ends at its last record."""
        spans = []
        for seg in self.info.get("segments", []):
            if not isinstance(seg, dict) or not all(key in seg for key in ("host", "device", "start")):
                continue  # a segment that does not say where and when it ran overlaps nothing it can be held to
            end = seg.get("end") or self.last_written()
            spans.append((seg["host"], seg["device"], seg["start"], end))
        return spans

    def last_written(self) -> float:
        """When the run last wrote a record: its metrics file's time, or its run.json's (no record yet)."""
        for name in (METRICS, RUN_INFO):
            try:
                return (self.path / name).stat().st_mtime
            except OSError:
                continue
        return math.inf

    @property
    def compile_seconds(self) -> float | None:
        return self.info.get("compile_s")

    @property
    def compile_cache_hits(self) -> tuple[int, int] | None:
        """(graphs read from the compile cache, graphs compiled) of the run's compile; None where it did not compile
        or did not record it (runs before it was kept)."""
        hits, misses = self.info.get("compile_cache", (None, None))
        return None if hits is None or misses is None else (hits, hits + misses)

    def others_cores(self) -> float | None:
        """The cores other processes used, on average over the steady steps (each step's reading weighed by its
        time); None where the run did not record it (runs before it was kept, a system that does not say)."""
        read = [(s["perf/others_cores"], s["perf/step_ms"]) for s in self.steady_steps() if "perf/others_cores" in s]
        spent = sum(ms for _, ms in read)
        return sum(cores * ms for cores, ms in read) / spent if spent > 0 else None

    @property
    def batch_split(self) -> tuple[int | None, int | None, int]:
        """(micro-batch, accumulation steps, ranks): how each step's batch was split, which sets how fast a step
        runs but not what it computes."""
        t, ranks = self.info["trainer"], self.info.get("world_size") or 1
        micro, batch = t.get("micro_batch_size"), t.get("batch_size")
        accum = batch // (micro * ranks) if isinstance(micro, int) and isinstance(batch, int) and micro > 0 else None
        return (micro if isinstance(micro, int) else None), accum, ranks

    @property
    def tokens_seen(self) -> int | None:
        per_step = self.info.get("tokens_per_step")
        return per_step * self.last_step if per_step is not None else None

    @property
    def token_budget(self) -> int | None:
        """Tokens the run was set to train on; None for a run that failed before it recorded its tokens per step."""
        per_step, steps = self.info.get("tokens_per_step"), self.info["trainer"].get("max_steps")
        return per_step * steps if per_step is not None and steps is not None else None


def is_number(value) -> bool:
    """A figure a report can compute with (an int or float, not a bool, a string or null)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def warmup_steps(n_steps: int) -> int:
    return min(MAX_WARMUP_STEPS, int(n_steps * WARMUP_FRACTION))


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (symbolic links followed); something else there (a named pipe, a
    device, a folder) is never opened: a warning names it. False, silently, where nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if not stat.S_ISREG(mode):
        warn(f"{path} is not a regular file (a named pipe, a device or a folder?): not read")
    return stat.S_ISREG(mode)


def read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file; None where it is missing or is not a regular file (``is_regular``). Opened
    without waiting and checked again once open, so a file swapped for a named pipe meanwhile cannot block."""
    if not is_regular(path):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warn(f"{path} is not a regular file (a named pipe, a device or a folder?): not read")
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read_json_file(path: Path) -> dict | None:
    """A JSON object from a regular file; None where the file is missing or not a regular file. Raises
    ValueError where its content is not UTF-8 JSON."""
    data = read_regular(path)
    return None if data is None else json.loads(data.decode())


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file; a damaged line (a run killed mid-write, bytes that are not UTF-8, a
    value that is not a record of a step) is skipped with a warning naming the file and line."""
    records = []
    for number, raw in enumerate((read_regular(path) or b"").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode())
        except UnicodeDecodeError as err:
            warn(f"{path}:{number} is not UTF-8 text ({err.reason} at byte {err.start}): skipped that line")
            continue
        except json.JSONDecodeError:
            warn(f"{path}:{number} is not a JSON record (cut by a kill?): skipped that line")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            warn(f"{path}:{number} is not a record of a step (no integer 'step'): skipped that line")
            continue
        records.append(record)
    return records


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class NotARun(ValueError):
    """A directory that cannot be read as a run (its run.json missing, damaged or not a regular file)."""


def load_run(path: Path) -> Run:
    info = read_json_file(path / RUN_INFO)
    if info is None:
        raise NotARun(f"its {RUN_INFO} is missing or not a regular file")
    info["model"]["attention"], info["model"]["kernel"], info["trainer"]["seed"]  # noqa: B018  (KeyError: damaged)
    records = read_jsonl(path / METRICS)
    # A resumed run may log a step twice (before and after the interruption): keep the latest.
    steps = {r["step"]: r for r in records if "train/loss" in r and is_number(r["train/loss"])}
    evals = {r["step"]: r for r in records if "val/loss" in r and is_number(r["val/loss"])}
    compiled = [r for r in records if "perf/compile_s" in r]
    if compiled:  # the last compile: its time, and how many of its graphs the compile cache gave
        last = compiled[-1]
        info["compile_s"] = last["perf/compile_s"]
        info["compile_cache"] = (last.get("perf/compile_cache_hits"), last.get("perf/compile_cache_misses"))
    profile = optional_json(path / PROFILE / PROFILE_SUMMARY)
    return Run(path, info, [steps[s] for s in sorted(steps)], [evals[s] for s in sorted(evals)],
               failure_reason(path), profile)  # fmt: skip


def optional_json(path: Path) -> dict | None:
    """A JSON file that adds to a report (a profile summary): None, with a warning, where it is damaged."""
    try:
        return read_json_file(path)
    except ValueError as err:
        warn(f"{path} is damaged ({type(err).__name__}: {err}): not used")
        return None


def failure_reason(path: Path) -> str | None:
    """Why the run failed (its failure.json's reason); None where it did not fail. A failure.json that cannot be
    read still marks the run failed, and the reason says so."""
    failure = path / FAILURE
    if not failure.exists():
        return None
    try:
        recorded = read_json_file(failure)
    except ValueError as err:
        return f"{FAILURE} is damaged ({type(err).__name__}): no reason recorded"
    if recorded is None:
        return f"{FAILURE} is not a regular file: no reason read"
    reason = recorded.get("reason") if isinstance(recorded, dict) else None
    return str(reason) if reason else f"{FAILURE} gives no reason"


def natural_key(path: Path | str) -> list:
    """Sort "2_wrapper" before "10_fused_qkv" (a multirun's job numbers in order), "kv4" before "kv12"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Run directories given directly, or found below a multirun directory, in a stable order."""
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{given} does not exist; give run directories or a multirun directory")
        if not path.is_dir():  # a file, a named pipe: never opened
            warn(f"{given} is not a directory: skipped (give run directories or a multirun directory)")
        elif (path / RUN_INFO).exists():
            found.append(path)
        else:
            below = [p.parent for p in path.rglob(RUN_INFO)
                     if (p.parent / METRICS).exists() or (p.parent / FAILURE).exists()]  # fmt: skip
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
        except NotARun as err:
            warn(f"skipped {path}: {err}")
        except (ValueError, KeyError, TypeError, OSError) as err:  # ValueError: not JSON, or not UTF-8
            warn(f"skipped {path}: its run.json is damaged ({type(err).__name__}: {err})")
    if not runs:
        raise ValueError(f"every run found in {', '.join(map(str, paths))} is damaged; nothing to compare")
    shown = varied_axes(runs)
    for run in runs:
        run.shown = shown
    return runs


def varied_axes(runs: list[Run]) -> tuple[str, ...]:
    """The optional axes of a label (key/value heads, window, position encoding, rotary base) that take more
    than one value among these runs: each run's label spells them, as a sweep over them names its directories
    (``wrapper-sdpa-kv4``, ``fused_qkv-sdpa-learned``). On/off modifications (QK-norm, softcap, sinks) are
    spelled only where on, varied or not."""
    models = [r.info["model"] for r in runs]
    values = {"n_kv_head": {m.get("n_kv_head") or m.get("n_head") for m in models},
              "window": {m.get("window") for m in models},
              "position": {m.get("position", "learned") for m in models},
              "rope_theta": {m.get("rope_theta", 10000.0) for m in models if m.get("position") == "rope"}}  # fmt: skip
    return tuple(axis for axis, seen in values.items() if len(seen) > 1)

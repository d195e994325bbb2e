"""The run's record: its directory, ``run.json``, ``metrics.jsonl`` and, when enabled, a wandb run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from common.optim_label import OPTIM_DEFAULTS, optimizer_label, training_label
from common.run_files import (
    FAILURE,
    LAST,
    METRICS,
    RUN_INFO,
    SAMPLES,
    create_owner,
    lock_owner,
    read_json,
    remove_stale_checkpoints,
    rewrite_in_place,
    sample_entry,
    write_json,
)
from common.wandb_mode import wandb_mode as common_wandb_mode
from data.config import DataConfig
from model.config import attention_label, schedule_kinds, schedule_text
from training import slurm
from training.config import LoggerConfig, TrainConfig


def wandb_mode(cfg: LoggerConfig) -> str:
    """``auto``: WANDB_MODE if set, else online with an API key and offline without one (common.wandb_mode)."""
    return common_wandb_mode(cfg.mode)


def run_name(cfg: TrainConfig) -> str:
    """``<attention>-<kernel>-<model>`` (with the SDPA backend, key/value heads and window where they differ
    from the defaults), then the data where it is not the default corpus (``-tinyshakespeare``, ``-my_notes``
    for data.path=my_notes.txt), then the optimizer and schedule where they are not AdamW and cosine (``-muon_qkv``,
    ``-wsd``: common/optim_label.py), or the name train.py made (with a sweep's other overrides)."""
    return cfg.logger.name or run_label(vars(cfg.model), cfg.data, model_name=cfg.model.name, optim=vars(cfg.optim),
                                        preset=cfg.logger.preset)


def run_label(model: dict, data, show: tuple[str, ...] | list[str] = (), model_name: str | None = None,
              optim: dict | None = None, preset: str | None = None) -> str:  # fmt: skip
    """What a run's directory and its name both say of it, in this order: the preset that chose its schedule of
    layers (``kimi_linear``; ``preset``, where one did), how it attends (``attention_label``,
    spelling ``show``'s axes at their default too), the model (``model_name``: the name gives it, the directory
    leaves it to its config), the data where it is not the default corpus, and how it trains where that is not
    AdamW and cosine (``training_label``): the directory ``fused_qkv-sdpa-my_notes-muon_qkv``, the name
    ``fused_qkv-sdpa-nano-my_notes-muon_qkv``."""
    preset = preset if model.get("layer_pattern") else None
    parts = (preset, attention_label(model, show=show), model_name, data_part(data), training_label(optim))
    return "-".join(part for part in parts if part)


GENERIC_DATA = ("files", "hub")  # configs/data's names that say only where the text comes from


def data_part(data) -> str:
    """The data as a run's name spells it: "" for the default corpus; for data=files and data=hub, what
    data.path names (its file, folder or dataset, without a suffix: ``my_notes``); the data's name otherwise."""
    if data.name == DataConfig.name:
        return ""
    where = data.path if data.name in GENERIC_DATA else None
    if not where:
        return data.name
    stem = Path(str(where).rstrip("/").split("?")[0]).stem
    return re.sub(r"[^\w.+=-]+", "_", stem).strip("._") or data.name


def run_tags(cfg: TrainConfig) -> list[str]:
    """The run's wandb tags (``tags_of``)."""
    return tags_of(vars(cfg.model), cfg.data.name, cfg.logger.preset, cfg.logger.tags, vars(cfg.optim))


def tags_of(model: dict, data: str, preset: str | None, tags: list[str], optim: dict | None = None) -> list[str]:
    """The wandb tags: what the layers run, each other part of the run's label (``kv2``, ``rope``, ``sinks``: only
    the options set), the model, the data, the optimizer always (``adamw``, ``muon_qkv``: a filter finds either), the
    schedule where not cosine (``wsd``) and the user's tags. A model's layers run its layout and kernel; a
    schedule's are its preset (where one chose it) and, where its kinds run other layouts, what each kind runs
    (``kimi_linear``, ``K=kda``, ``M=mla/sdpa``: not ``mla``, ``sdpa``, which three of its four layers do not run).
    ``model`` is a GPTConfig's fields (a dict: run.json's too)."""
    parts = attention_label(model, sep="|").split("|")[2:]
    # wandb refuses a tag past 64 characters: a long schedule's part goes as its pattern and each kind's part
    parts = [piece[:WANDB_TAG_LIMIT] for part in parts
             for piece in ([part] if len(part) <= WANDB_TAG_LIMIT else part.split("_"))]  # fmt: skip
    layers, kinds = [model["attention"], model["kernel"]], schedule_kinds(model)
    if kinds != schedule_kinds({**model, "layer_kinds": {}}):  # some kind runs another layout than the model's
        layers = [f"{kind}={ran}"[:WANDB_TAG_LIMIT] for kind, ran in kinds.items()]
    trained = [part for part in training_label(optim).split("-") if part]  # muon_qkv, wsd
    if not optimizer_label(optim):  # the default optimizer, which the label leaves unsaid
        trained.insert(0, OPTIM_DEFAULTS["name"])
    return [*([preset] if kinds and preset else []), *layers, *parts, model["name"], data, *trained, *tags]


def schedule_fact(cfg: TrainConfig) -> dict:
    """run.json's ``schedule`` for a schedule of layers: its preset and what each kind runs (``kimi_linear: KKKM,
    K=kda, M=mla/sdpa``); nothing for a model whose layers are alike."""
    text = schedule_text(vars(cfg.model), cfg.logger.preset)
    return {"schedule": text} if text else {}


WANDB_TAG_LIMIT = 64  # characters (wandb's settings refuse a longer tag)


class RunDirClaim:
    """A run directory this process writes to, held by an exclusive lock on its owner file until
    ``release`` (or the process's death: a killed run's lock goes with it)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def claim_run_dir(run_dir: str | None, continuing: bool = False, resume_auto: bool = False) -> RunDirClaim:
    """Create the run directory and claim it. A new run refuses a directory that holds another run (``resume_auto``:
    one that ``trainer.resume=auto`` found empty, which another process has claimed since); a continuation
    (``trainer.resume=auto``) takes its own; neither writes where another process does."""
    if not run_dir:
        raise ValueError("trainer.run_dir is not set; set trainer.run_dir=<folder> (train.py sets Hydra's)")
    path = Path(run_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    if not continuing:
        taken = (path / METRICS).exists() or (path / LAST).exists() or not create_owner(path)
        if taken and resume_auto:
            raise ValueError(
                f"trainer.run_dir={path} was empty when this command's trainer.resume=auto looked, and another "
                f"process has started a run there since (two commands on one directory at once): this one stops, "
                f"writing nothing. Run it again once the other has ended: it continues that run, or skips it "
                f"finished"
            )
        if taken:
            raise ValueError(
                f"trainer.run_dir={path} already holds another run (started in the same second, or finished); "
                f"writing there would mix two runs. To continue that run in place add trainer.resume=auto (with "
                f"the run's own settings); trainer.resume={path} continues it in a new directory; otherwise "
                f"choose another trainer.run_dir"
            )
    fd = lock_owner(path)
    if fd is None:
        raise ValueError(
            f"trainer.run_dir={path} is being written by another process right now (a run or its "
            f"continuation); wait for it to end, or choose another directory"
        )
    remove_stale_checkpoints(path)
    return RunDirClaim(path, fd)


def record_failure(run_dir: Path, container: dict, cfg: TrainConfig, reason: str) -> None:
    """``failure.json`` (and ``run.json`` if the run never got to write it): reports show the run as failed."""
    if not (run_dir / RUN_INFO).exists():
        write_json(run_dir / RUN_INFO, {**container, "name": run_name(cfg), "group": cfg.logger.group,
                                        **schedule_fact(cfg)})  # fmt: skip
    write_json(run_dir / FAILURE, {"reason": reason})


class RunLog:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors it to a wandb run."""

    def __init__(self, run_dir: Path, wandb_run=None, wandb_offline: bool = False) -> None:
        self.path = run_dir / METRICS
        self.file = open(self.path, "a", buffering=1)  # line-buffered: a crash loses at most a line
        self.wandb_run, self.wandb_offline = wandb_run, wandb_offline

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def update_info(self, **facts) -> None:
        """Add facts learnt while running (e.g. the SDPA kernel the graph calls) to run.json and wandb's config."""
        path = self.path.with_name(RUN_INFO)
        write_json(path, {**json.loads(path.read_text()), **facts})
        if self.wandb_run is not None:
            self.wandb_run.config.update(facts, allow_val_change=True)

    def log(self, step: int, metrics: dict) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def best(self, step: int, metrics: dict) -> None:
        """The best evaluation so far, as wandb summary values (``best/val_loss``...)."""
        if self.wandb_run is not None:
            self.wandb_run.summary.update({"best/val_loss": metrics["val/loss"], "best/val_bpb": metrics["val/bpb"],
                                           "best/step": step})  # fmt: skip

    def sample(self, step: int, text: str) -> None:
        """Generated text: a ``samples.txt`` line in the run directory and a wandb Table."""
        with open(self.path.with_name(SAMPLES), "a") as f:
            f.write(sample_entry(step, text))
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.log({"samples": wandb.Table(columns=["step", "text"], data=[[step, text]])}, step=step)

    def close(self, status: str, summary: dict | None = None) -> None:
        """Record how the run ended (``status``: finished, interrupted or failed) and when; then close."""
        path = self.path.with_name(RUN_INFO)
        info = json.loads(path.read_text())
        info["status"] = status
        if summary is not None:
            info["summary"] = summary
        if info.get("segments"):
            info["segments"][-1]["end"] = time.time()
        try:
            try:
                write_json(path, info)
            except OSError:  # a full disk has no room for the temporary copy; the file's own blocks have
                rewrite_in_place(path, json.dumps(info, indent=2))
        finally:
            self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.summary["status"] = status  # in the summary, which ends with the run; not the config
            self.wandb_run.finish()


# run.json's fields that change while the run goes on: wandb's config is written once, so they stay out of it
# (the status is put in the wandb summary when the run ends).
_CHANGING = ("status", "segments", "summary")


def wandb_config(info: dict) -> dict:
    """The run.json facts that hold for the whole run: wandb's config."""
    return {key: value for key, value in info.items() if key not in _CHANGING}


def define_metrics(run) -> None:
    """Charts against tokens as well as steps; the summary keeps the best (lowest) validation numbers."""
    run.define_metric("tokens")
    for pattern in ("train/*", "perf/*", "lr"):
        run.define_metric(pattern, step_metric="tokens")
    run.define_metric("val/loss", step_metric="tokens", summary="min")
    run.define_metric("val/bpb", step_metric="tokens", summary="min")


def segment(device_id: str, start: float, max_steps: int) -> dict:
    """Where and when this process ran the run, from the moment it began the run's work (data, model,
    compilation: all of it competes for the machine): reports flag runs that shared a machine at the same time;
    and the budget it ran towards (a continuation that shortened the run is seen later: ``continuation``)."""
    return {"host": socket.gethostname(), "device": device_id, "pid": os.getpid(), "start": start,
            "end": None, "max_steps": max_steps,
            **({"slurm": slurm.job_facts()} if slurm.in_slurm_job() else {})}  # fmt: skip


@contextlib.contextmanager
def nothing_of_wandb_if_interrupted(run_dir: Path) -> Iterator[None]:
    """Ctrl-C or SIGTERM while wandb starts (the script's start-up: common/startup.py) keeps none of it: the folders
    it made in ``run_dir`` go, and its exception hook (which would print the interruption's traceback above the
    start-up's one line) gives way to the one before. Its exit handler never runs: the process ends by the signal."""
    folder, hook = run_dir / "wandb", sys.excepthook
    before = set(folder.iterdir()) if folder.is_dir() else None
    try:
        yield
    except KeyboardInterrupt:
        sys.excepthook = hook
        if before is None:
            shutil.rmtree(folder, ignore_errors=True)
        else:  # a run continued in place: its earlier segments' wandb folders stay
            for path in set(folder.iterdir()) - before:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink()
        raise


def open_run_log(cfg: TrainConfig, container: dict, run_dir: Path, facts: dict, wandb_id: str | None,
                 device_id: str, started: float) -> RunLog:  # fmt: skip
    """Write ``run.json`` (the resolved config, the facts reports need, status ``running`` and this process's
    segment after those of the runs it continues in place) and start wandb with the same."""
    before = read_json(run_dir / RUN_INFO) or {}
    info = {**container, "name": run_name(cfg), "group": cfg.logger.group, **schedule_fact(cfg), **facts,
            "status": "running",
            "segments": [*before.get("segments", []), segment(device_id, started, cfg.trainer.max_steps)]}  # fmt: skip
    run = None
    if cfg.logger.kind == "wandb":
        import wandb  # imported here: runs with logger=none never pay for it

        mode = wandb_mode(cfg.logger)
        tags = run_tags(cfg)
        # A continued offline run: wandb's closing lines would say to upload this segment alone with wandb sync, which
        # replaces the first segment's history; the run's last words say how to upload it whole (rebuild_wandb.py).
        quiet = wandb.Settings(quiet=True) if mode == "offline" and wandb_id else None
        with nothing_of_wandb_if_interrupted(run_dir):
            run = wandb.init(
                project=cfg.logger.project, entity=cfg.logger.entity, group=cfg.logger.group, name=info["name"],
                tags=tags, config=wandb_config(info), dir=str(run_dir), mode=mode, id=wandb_id,
                resume="allow" if wandb_id else None, job_type="train", settings=quiet,
            )  # fmt: skip
        define_metrics(run)
        info = {**info, "wandb_id": run.id}  # for rebuild_wandb.py
    write_json(run_dir / RUN_INFO, info)
    return RunLog(run_dir, run, wandb_offline=run is not None and mode == "offline")

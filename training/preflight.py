"""A training run's preflight: everything that can be refused, checked before any work.

``preflight(cfg)`` validates the config; settles the ranks, the device, the dtype and the micro-batch;
finds the checkpoint the run continues (``trainer.resume=<dir>``, ``trainer.resume=auto``, a requeued
SLURM job) or starts from (``trainer.init_from``) and holds it to the reuse rule (training/reuse.py);
and checks that the plan fits the device. It returns a frozen ``RunSetup``, or the command's whole
answer where there is nothing to train (``trainer.plan=true``; a finished run, skipped). Data
preparation, the process group, the run directory and the steps follow (training/loop.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from common.run_files import remove_stale_checkpoints
from data.sources import check_source
from data.tokenizers import GPT2_IDS
from model import load_model
from model.attention.kernels import check_kernel_runs
from model.checkpoints.checkpoint import Checkpoint, checkpoint_path, load_checkpoint
from model.config import GPTConfig
from model.device import available_memory, device_id, resolve_device, resolve_dtype
from training import continuation, reuse, slurm
from training.config import TrainConfig, TrainerConfig, micro_batch_for, validate
from training.continuation import Continuation
from training.distributed import Distributed, from_environment
from training.gpu_slots import claim_free_slot, shares_gpus_with_other_jobs
from training.memory import release_memory
from training.plan import auto_micro_batch, check_fits_device, make_plan, plan_of, planned_model

log = logging.getLogger("headlab.train")


@dataclass(frozen=True)
class RunSetup:
    """What the preflight settled: the run's config and where, how and from what it trains."""

    config: TrainConfig  # trainer.micro_batch_size a number (with auto, this rank's pick: the ranks agree later)
    planned: GPTConfig  # the model, its vocabulary the tokenizer's
    dist: Distributed
    device: torch.device
    dtype: torch.dtype
    started: float  # when this process began the run's work (run.json's segment)
    auto_micro: bool = False  # trainer.micro_batch_size=auto
    resume: Checkpoint | None = None  # the training state the run continues from
    continuing: Continuation | None = None  # what trainer.resume=auto found in the run directory
    init_weights: dict | None = None  # trainer.init_from's weights, in this run's layout
    # a run resumed in a new directory that measures val/loss otherwise (another trainer.eval_windows, other
    # data): the changes, as overrides; its validation curve and best start anew
    measured_anew: tuple[str, ...] = ()

    @property
    def in_place(self) -> bool:
        """The run continues in its own directory (trainer.resume=auto, a requeued job)."""
        return self.continuing is not None and self.continuing.in_place


def preflight(cfg: DictConfig | TrainConfig) -> RunSetup | dict:
    """Check everything that can be refused, before data preparation or model building (see the module)."""
    started = time.time()  # this process's work on the run begins (run.json's segment)
    config: TrainConfig = cfg if isinstance(cfg, TrainConfig) else OmegaConf.to_object(cfg)
    validate(config)
    slurm.use_the_cpus_given()
    dist = from_environment()
    # A rank's micro-batch, unset: its whole share on this many ranks. Refuses a batch that does not split.
    config = with_micro_batch(config, micro_batch_for(config.trainer, dist.world_size))
    planned = planned_model(config)
    if config.trainer.plan:  # needs no GPU: plans a GPU run from a laptop
        plan, text = plan_of(config, planned, dist.world_size)
        print(text, flush=True)  # the plan is the command's output, not a log line
        return {"plan": plan}
    check_source(config.data)  # a wrong data.path is named before a tokenizer's download can fail
    continuing = found_continuation(config, planned)
    if continuing is not None and continuing.action == "finished":
        return skipped(continuing, config.trainer, dist)
    device = claimed_device(config.trainer, dist)
    release_memory(device)  # an earlier job of a multirun must not shrink this one's plan
    dtype = resolve_dtype(config.trainer.dtype, device)
    check_kernel_runs(planned, device, dtype, training=True)
    auto_micro = config.trainer.micro_batch_size == "auto"
    if auto_micro:  # chosen per rank now (an error before any work), agreed on by the ranks later
        config = with_micro_batch(config, auto_micro_batch(config, planned, dist.world_size, dtype,
                                                           available_memory(device)))  # fmt: skip
    resume = checkpoint_to_resume(config, planned, continuing)
    check_fits_device(make_plan(config, planned, dist.world_size, dtype), device)
    init_weights = initial_weights(config, planned) if config.trainer.init_from else None
    measured_anew = validation_measured_anew(config, resume) if continuing is None else ()
    return RunSetup(config, planned, dist, device, dtype, started, auto_micro, resume, continuing, init_weights,
                    measured_anew)  # fmt: skip


def validation_measured_anew(cfg: TrainConfig, resume: Checkpoint | None) -> tuple[str, ...]:
    """A run resumed in a new directory (``trainer.resume=<dir>``) that measures val/loss otherwise than the run it
    continues (another ``trainer.eval_windows``, other data): the changes, as overrides."""
    if resume is None:
        return ()
    return tuple(f"{reuse.settings([d])} (it was {reuse.hydra_value(d.saved)})"
                 for d in reuse.validation_changes(resume.train_config or {}, asdict(cfg)))  # fmt: skip


def with_micro_batch(cfg: TrainConfig, micro: int) -> TrainConfig:
    return replace(cfg, trainer=replace(cfg.trainer, micro_batch_size=micro))


def found_continuation(cfg: TrainConfig, planned: GPTConfig) -> Continuation | None:
    """With ``trainer.resume=auto`` and in the rerun of a requeued SLURM job: what the run directory holds
    (a run to continue in place, a finished one, nothing)."""
    if cfg.trainer.resume != "auto" and not slurm.is_requeued_run():
        return None
    return continuation.inspect(cfg.trainer.run_dir, OmegaConf.to_container(OmegaConf.structured(
        replace(cfg, model=planned))))  # fmt: skip


def skipped(continuing: Continuation, t: TrainerConfig, dist: Distributed) -> dict:
    """A finished run found by ``trainer.resume=auto``: nothing written, its summary returned."""
    if dist.is_main:
        log.info("already finished: %s (step %s of trainer.max_steps=%d); skipped. A larger "
                 "trainer.max_steps extends it", continuing.run_dir, continuing.summary.get("step"),
                 t.max_steps)  # fmt: skip
    # How the finished run's last process ended (a signal that came as it finished, as it recorded) is no word on
    # this command: a skipped job never stops a sweep's continuation.
    ended = ("stopped_by", "signal", "requeued")
    kept = {k: v for k, v in continuing.summary.items() if k not in ended}
    return {**kept, "stopped_by": None, "run_dir": str(continuing.run_dir), "skipped": True}


def claimed_device(t: TrainerConfig, dist: Distributed) -> torch.device:
    """This rank's device; where jobs share the machine's GPUs, a free one claimed."""
    device = resolve_device(t.device, dist.local_rank)
    if device.type == "cuda" and t.device in ("auto", "cuda") and not dist.enabled and shares_gpus_with_other_jobs():
        device = torch.device("cuda", claim_free_slot([device_id(torch.device("cuda", i))
                                                       for i in range(torch.cuda.device_count())]))  # fmt: skip
    return device


def checkpoint_to_resume(cfg: TrainConfig, planned: GPTConfig, continuing: Continuation | None) -> Checkpoint | None:
    """The checkpoint the run continues from (in place, or ``trainer.resume=<dir>``), checked; None for a new run."""
    if continuing is not None:
        ckpt, source = continuing.checkpoint, continuing.run_dir
    elif cfg.trainer.resume:
        ckpt, source = load_checkpoint(cfg.trainer.resume), cfg.trainer.resume
        remove_stale_checkpoints(checkpoint_path(cfg.trainer.resume).parent)  # what a kill mid-save left there
    else:
        return None
    if ckpt is not None:
        check_resumable(cfg, planned, ckpt, source)
    return ckpt


def check_resumable(cfg: TrainConfig, planned: GPTConfig, ckpt: Checkpoint, source: str | Path) -> None:
    """Refuse a checkpoint this run cannot continue (``source``: where it came from, as the user named it)."""
    stop_at = cfg.trainer.stop_at_step
    optim = {"optim": ckpt.train_config["optim"]} if "optim" in (ckpt.train_config or {}) else {}
    diffs = reuse.differences("resume", {"model": ckpt.model_config, **optim},
                              {"model": asdict(planned), "optim": asdict(cfg.optim)})  # fmt: skip
    if diffs:
        new = (f" (trainer.init_from={source} starts one from its weights with a new optimizer: a resume continues "
               f"its optimizer's state)" if any(d.kind == "optimizer" for d in diffs) else "")  # fmt: skip
        raise ValueError(f"cannot resume from {source}: this run's {reuse.differ(diffs)} from the checkpoint's. "
                         f"Resume with the checkpoint's settings (add {reuse.restoring(diffs)}), or start a new "
                         f"run{new}")  # fmt: skip
    if ckpt.optimizer is None:
        raise ValueError(f"cannot resume from {source}: it holds weights but no training state")
    if ckpt.step >= cfg.trainer.max_steps:
        raise ValueError(
            f"nothing to resume: {source} is at step {ckpt.step}, trainer.max_steps="
            f"{cfg.trainer.max_steps}; raise trainer.max_steps to train further"
        )
    if stop_at is not None and stop_at <= ckpt.step:
        raise ValueError(
            f"trainer.stop_at_step={stop_at} but {source} is already at step {ckpt.step}; leave "
            f"trainer.stop_at_step out (or raise it) to train further"
        )


def initial_weights(cfg: TrainConfig, planned: GPTConfig) -> dict:
    """``trainer.init_from``'s weights in this run's layout, checked against the configured model by the reuse
    rule: the weights' shapes must agree; ``block_size`` may shrink (position embeddings cropped, as nanoGPT's
    fine-tuning does); the layout, kernel, window and dropout are this run's."""
    source = load_model(cfg.trainer.init_from, attention=cfg.model.attention, kernel=cfg.model.kernel)
    have = source.model.config
    found = reuse.differences("init_from", {"model": asdict(have)}, {"model": asdict(planned)})
    differing = [d for d in found if d.kind != "positions"]
    wrong = [f"this run's {reuse.differ(differing)} from the source's {reuse.settings(differing, 'saved')}"]
    wrong = wrong if differing else []
    if any(d.kind == "positions" for d in found):
        wrong.append(f"model.block_size={planned.block_size} is longer than the source's {have.block_size} positions")
    names = {source.tokenizer.name, cfg.data.tokenizer}
    if len(names) > 1 and not names <= set(GPT2_IDS):
        wrong.append(f"data.tokenizer={cfg.data.tokenizer} but the source was trained with {source.tokenizer.name}")
    if wrong:
        raise ValueError(
            f"trainer.init_from={cfg.trainer.init_from} does not fit this run: " + "; ".join(wrong)
            + ". Set the model to the source's shape (e.g. model=gpt2_small for gpt2) and its tokenizer"
        )
    weights = source.model.state_dict()
    if "transformer.wpe.weight" in weights:  # a learned position table: crop it to this run's context
        weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][: planned.block_size]
    return weights

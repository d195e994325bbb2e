"""``train(cfg)``: the pure training function behind ``train.py``.

config -> tokenizer (and the plan) -> data (prepared on demand, before any
process group exists) -> model + optimizer (or a checkpoint to resume) ->
steps -> metrics, evaluations and checkpoints in the run directory. Only
rank 0 writes.
"""

from __future__ import annotations

import gc
import logging
import math
import shlex
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from analysis.runs import MAX_WARMUP_STEPS, WARMUP_FRACTION
from common.run_files import BEST, FAILURE, LAST, PROFILE, remove_stale_checkpoints
from data.loader import BatchLoader, PreparedData
from data.prepare import prepare
from data.sources import check_source
from data.tokenizers import GPT2_IDS, VOCAB_SIZES, get_tokenizer
from model import GPT, load_model
from model.checkpoint import Checkpoint, checkpoint_path, load_checkpoint
from model.compiling import compile_for_training, eager
from model.device import (
    autocast,
    available_memory,
    device_id,
    device_name,
    peak_flops,
    resolve_device,
    resolve_dtype,
)
from model.generation import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, generate
from model.kernels import check_kernel_runs
from training import continuation, slurm
from training.config import TrainConfig, grad_accum_steps, micro_batch_for, validate
from training.distributed import Distributed, from_environment, init_distributed
from training.evaluate import Evaluator
from training.gpu_slots import claim_free_slot, shares_gpus_with_other_jobs
from training.memory import MemoryMeter
from training.optim import lr_at, make_optimizer
from training.plan import (
    GIB,
    auto_choices_text,
    auto_micro_batch,
    check_fits_device,
    cpu_matmul_flops,
    make_plan,
    planned_device,
    planned_dtype,
)
from training.profiling import PROFILE_STEPS, StepProfiler, name_cpu_kernels, summary_table
from training.run_log import claim_run_dir, open_run_log, record_failure, run_name
from training.signals import StopSignals
from training.step import TrainStep

log = logging.getLogger("headlab.train")
# Fields of the model config that must agree with a checkpoint to resume from it.
_SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "attention")
# What run.json keeps of a run's summary when it ends (a finished run's is returned when it is skipped).
FINAL_KEYS = ("step", "train_loss", "val_loss", "val_bpb", "best_val_loss", "stopped_by")


def train(cfg: DictConfig | TrainConfig) -> dict:
    """Train as ``cfg`` says; returns a summary (run_dir, step, last train/val loss, val bpb; ``stopped_by``
    a signal's name and ``requeued`` when a SLURM job is being requeued)."""
    started = time.time()  # this process's work on the run begins (run.json's segment)
    config: TrainConfig = cfg if isinstance(cfg, TrainConfig) else OmegaConf.to_object(cfg)
    validate(config)
    t = config.trainer
    # Everything that can be refused is checked before data preparation or model building.
    slurm.use_the_cpus_given()
    dist = from_environment()
    # A rank's micro-batch, unset: its whole share on this many ranks. Refuses a batch that does not split.
    config = with_micro_batch(config, micro_batch_for(t, dist.world_size))
    t = config.trainer
    planned = replace(config.model, vocab_size=config.model.vocab_size or VOCAB_SIZES[config.data.tokenizer])
    if t.plan:  # needs no GPU: plans a GPU run from a laptop
        plan, text = plan_of(config, planned, dist.world_size)
        print(text, flush=True)  # the plan is the command's output, not a log line
        return {"plan": plan}
    check_source(config.data)  # a wrong data.path is named before a tokenizer's download can fail
    continuing = None
    if t.resume == "auto" or slurm.is_requeued_run():  # continue the run in its own directory, if there is one
        continuing = continuation.inspect(t.run_dir, OmegaConf.to_container(OmegaConf.structured(config)))
        if continuing.action == "finished":
            if dist.is_main:
                log.info("already finished: %s (step %s of trainer.max_steps=%d); skipped. A larger "
                         "trainer.max_steps extends it", continuing.run_dir, continuing.summary.get("step"),
                         t.max_steps)  # fmt: skip
            return {**continuing.summary, "run_dir": str(continuing.run_dir), "skipped": True}
    device = resolve_device(t.device, dist.local_rank)
    if device.type == "cuda" and t.device in ("auto", "cuda") and not dist.enabled and shares_gpus_with_other_jobs():
        device = torch.device("cuda", claim_free_slot([device_id(torch.device("cuda", i))
                                                       for i in range(torch.cuda.device_count())]))  # fmt: skip
    dtype = resolve_dtype(t.dtype, device)
    check_kernel_runs(planned, device, dtype, training=True)
    auto_micro = t.micro_batch_size == "auto"
    if auto_micro:  # chosen per rank now (an error before any work), agreed on by the ranks below
        config = with_micro_batch(config, auto_micro_batch(config, planned, dist.world_size, dtype,
                                                           available_memory(device)))  # fmt: skip
        t = config.trainer
    if continuing is not None:
        resume = continuing.checkpoint
    else:
        resume = load_checkpoint(t.resume) if t.resume else None
        if resume is not None:
            remove_stale_checkpoints(checkpoint_path(t.resume).parent)  # what a kill mid-save left there
    if resume is not None:
        check_resumable(config, resume, continuing.run_dir if continuing is not None else t.resume)
    check_fits_device(make_plan(config, planned, dist.world_size, dtype), device)
    init_weights = initial_weights(config, planned) if t.init_from else None

    tokenizer = get_tokenizer(config.data.tokenizer)
    model_config = replace(config.model, vocab_size=config.model.vocab_size or tokenizer.vocab_size)

    data = PreparedData(prepare(config.data, tokenizer))  # every rank; a file lock makes one of them prepare
    data.check_fits(model_config.block_size, model_config.vocab_size)
    init_distributed(dist, device)
    finished, claim = False, None
    try:
        if auto_micro:  # every rank must accumulate the same number of micro-steps: the smallest pick
            config = with_micro_batch(config, dist.min(t.micro_batch_size, device))
            t = config.trainer
            if dist.is_main:
                log.info("trainer.micro_batch_size=auto: %d sequences per forward pass (%d accumulation step(s))",
                         t.micro_batch_size, grad_accum_steps(t, dist.world_size))
        grad_accum = grad_accum_steps(t, dist.world_size)
        in_place = continuing is not None and continuing.in_place
        if dist.is_main:
            claim = claim_run_dir(t.run_dir, continuing=in_place)
            if in_place:  # drop what the stopped run logged after its checkpoint: it is computed again
                continuation.prepare_in_place(claim.path, resume.step if resume is not None else -1)
            if resume is not None:
                source = claim.path if in_place else t.resume
                log.info(continuation.describe(source, resume, t.max_steps, config.optim, claim.path))
            elif in_place:
                log.info("continuing %s from the start (it was stopped before its first checkpoint)", claim.path)
        run_dir = Path(dist.broadcast(str(claim.path) if dist.is_main else None))
        earlier = continuation.earlier_run_dirs(t.resume, run_dir, in_place) if resume is not None else []
        container = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
        container["model"]["vocab_size"] = model_config.vocab_size
        try:
            summary = Trainer(config, container, model_config, data, tokenizer, dist, device, dtype, grad_accum,
                              run_dir, resume, init_weights, started, earlier).run()  # fmt: skip
            finished = True
            return summary
        except torch.OutOfMemoryError as err:
            half, detail = max(1, t.micro_batch_size // 2), str(err).splitlines()[0][:160]
            reason = f"out of memory at trainer.micro_batch_size={t.micro_batch_size}; try trainer.micro_batch_size={half} ({detail})"  # noqa: E501
        # Out of the except block: the error's traceback (and the tensors its frames hold) is gone.
        free_memory(device)
        if dist.is_main:
            record_failure(run_dir, container, config, reason)
        raise RunFailed(f"{run_name(config)}: {reason}; recorded in {run_dir / FAILURE}")
    finally:
        dist.close(finished)
        if claim is not None:
            claim.release()


def with_micro_batch(cfg: TrainConfig, micro: int) -> TrainConfig:
    return replace(cfg, trainer=replace(cfg.trainer, micro_batch_size=micro))


def plan_of(cfg: TrainConfig, planned, world_size: int):
    """The plan and its text. ``micro_batch_size=auto`` is planned for the GPU at hand, or for an 80 GiB
    one (an H100) where there is none, with what it would pick on others."""
    t, dtype = cfg.trainer, planned_dtype(cfg.trainer)
    micro, note = None, ""
    if t.micro_batch_size == "auto":
        on_gpu = t.device != "cpu" and torch.cuda.is_available()
        free = available_memory(resolve_device(t.device)) if on_gpu else 80 * GIB
        micro = auto_micro_batch(cfg, planned, world_size, dtype, free)
        where = f"this GPU's {free / GIB:.1f} GiB free" if on_gpu else "an 80 GiB GPU (an H100; none is here)"
        note = f"\n  micro-batch auto: planned above for {where}\n" + auto_choices_text(cfg, planned, world_size, dtype)
    plan = make_plan(cfg, planned, world_size, dtype, micro_batch=micro)
    if planned_device(t) == "cpu":  # a run on this CPU: its time is estimated from a quick matmul measurement
        plan = replace(plan, cpu_flops=cpu_matmul_flops())
    return plan, plan.text() + note


def plan_variants(configs: dict[str, TrainConfig]) -> str:
    """The plans of a sweep's variants: a table of each one's micro-batch, memory and time, then each
    distinct plan once, headed by the variants it covers (seeds do not change a plan)."""
    world = from_environment().world_size
    plans: dict[str, list[str]] = {}
    rows = []
    for name, cfg in configs.items():
        validate(cfg)
        planned = replace(cfg.model, vocab_size=cfg.model.vocab_size or VOCAB_SIZES[cfg.data.tokenizer])
        plan, text = plan_of(cfg, planned, world)
        plans.setdefault(text, []).append(name)
        rows.append(f"| {name} | {plan.micro_batch} x {plan.grad_accum} | {plan.peak_bytes / GIB:,.1f} | "
                    f"{plan.time_text()} |")  # fmt: skip
    table = ["| run | micro-batch x accumulation | est. peak GiB | est. time |", "| --- | ---: | ---: | ---: |",
             *rows]  # fmt: skip
    parts = [f"{len(configs)} runs; estimates, as each plan below says:", "\n".join(table)]
    parts += [f"--- {'; '.join(names)} ---\n{text}" for text, names in plans.items()]
    return "\n\n".join(parts)


def progress_postfix(metrics: dict) -> dict:
    postfix = {"loss": f"{metrics['train/loss']:.4f}", "tok/s": f"{metrics['perf/tokens_per_sec']:,.0f}"}
    if "perf/mfu" in metrics:
        postfix["mfu"] = f"{metrics['perf/mfu']:.1%}"
    return postfix


class RunFailed(RuntimeError):
    """A run that could not finish (e.g. out of memory); its reason is recorded in the run directory."""


def free_memory(device: torch.device) -> None:
    """Release a failed job's memory before the next job of a multirun starts."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def initial_weights(cfg: TrainConfig, planned) -> dict:
    """``trainer.init_from``'s weights in this run's layout, checked against the configured model.

    Shape fields must agree; ``block_size`` may shrink (position embeddings cropped, as nanoGPT's
    fine-tuning does); dropout and the kernel are this run's.
    """
    source = load_model(cfg.trainer.init_from, attention=cfg.model.attention, kernel=cfg.model.kernel)
    have = source.model.config
    wrong = [f"model.{k}: {cfg.trainer.init_from} has {getattr(have, k)!r}, the config says {getattr(planned, k)!r}"
             for k in ("n_layer", "n_head", "n_embd", "bias", "vocab_size")
             if getattr(have, k) != getattr(planned, k)]  # fmt: skip
    if planned.block_size > have.block_size:
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
    weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][: planned.block_size]
    return weights


def check_resumable(cfg: TrainConfig, ckpt: Checkpoint, source) -> None:
    """Refuse a checkpoint this run cannot continue (``source``: where it came from, as the user named it)."""
    saved, stop_at = ckpt.model_config, cfg.trainer.stop_at_step
    mismatched = [f"model.{k}: checkpoint {saved[k]!r} vs now {getattr(cfg.model, k)!r}"
                  for k in _SHAPE_FIELDS if saved[k] != getattr(cfg.model, k)]  # fmt: skip
    if mismatched:
        raise ValueError(
            f"cannot resume from {source}: its config differs: " + "; ".join(mismatched)
            + ". Resume with the checkpoint's settings (see its config), or start a new run"
        )
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


class Trainer:
    """Holds a run's parts; ``run`` is the loop."""

    def __init__(self, cfg: TrainConfig, container: dict, model_config, data: PreparedData, tokenizer,
                 dist: Distributed, device: torch.device, dtype: torch.dtype, grad_accum: int, run_dir: Path,
                 resume: Checkpoint | None, init_weights: dict | None = None,
                 started: float | None = None, earlier_dirs: list[str] = ()) -> None:  # fmt: skip
        t = cfg.trainer
        self.cfg, self.container, self.tokenizer, self.dist = cfg, container, tokenizer, dist
        self.device, self.dtype, self.run_dir = device, dtype, run_dir
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.memory = MemoryMeter(device)

        torch.manual_seed(t.seed)  # the same initial weights on every rank, and in every layout
        self.model = GPT(model_config)
        if init_weights is not None:
            self.model.load_weights(init_weights)
        self.model.to(device)
        self.optimizer = make_optimizer(self.model, cfg.optim, device)
        self.scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        self.start_step, self.best_val, self.best_bpb, wandb_id = 0, math.inf, math.nan, None
        self.speeds: list[float] = []
        if resume is not None:
            self.model.load_weights(resume.model)
            self.optimizer.load_state_dict(resume.optimizer)
            if self.scaler is not None and resume.grad_scaler:
                self.scaler.load_state_dict(resume.grad_scaler)
            self.start_step, self.best_val, wandb_id = resume.step, resume.best_val_loss, resume.wandb_run_id
        self.wandb_id = wandb_id  # kept across resumes, even by a resumed run that logs without wandb

        if t.profile and t.compile and device.type == "cpu":
            name_cpu_kernels()
        forward = compile_for_training(self.model, t.compile_scope) if t.compile else self.model
        if dist.enabled:
            forward = DistributedDataParallel(forward, device_ids=[device.index] if device.type == "cuda" else None)
        loader = BatchLoader(data.tokens["train"], model_config.block_size, t.micro_batch_size, t.seed,
                             dist.rank, dist.world_size, device)  # fmt: skip
        self.step = TrainStep(self.model, forward, self.optimizer, loader, grad_accum, cfg.optim.grad_clip,
                              t.seed, dtype, dist, self.scaler)  # fmt: skip
        self.evaluate = Evaluator(data.tokens["val"], model_config.block_size, t.eval_windows, t.micro_batch_size,
                                  data.bytes_per_token("val"), device, dtype, dist)  # fmt: skip
        self.tokens_per_step = t.batch_size * model_config.block_size
        self.flops_per_token = self.model.flops_per_token()
        self.peak = peak_flops(device, dtype)
        facts = {
            "params": self.model.num_params(), "params_non_embedding": self.model.num_params(non_embedding=True),
            "world_size": dist.world_size, "device_name": device_name(device),
            "dtype": str(dtype).removeprefix("torch."), "data_dir": str(data.folder),
            "tokens_per_step": self.tokens_per_step, "continues": list(earlier_dirs),
        }  # fmt: skip
        # an offline wandb run continued: its segments are separate offline runs that wandb sync cannot merge
        self.wandb_segments = [*earlier_dirs, str(run_dir)] if resume is not None and resume.wandb_run_id else None
        self.log = (open_run_log(cfg, container, run_dir, facts, wandb_id, device_id(device), started or time.time())
                    if dist.is_main else None)  # fmt: skip
        if self.log is not None and self.log.wandb_id:
            self.wandb_id = self.log.wandb_id

    def run(self) -> dict:
        t = self.cfg.trainer
        stop_at = t.stop_at_step or t.max_steps
        step = self.start_step
        summary: dict = {"run_dir": str(self.run_dir), "start_step": step}
        self.best_step, started = None, time.perf_counter()
        to_run = stop_at - step
        warmup = min(MAX_WARMUP_STEPS, max(1, int(to_run * WARMUP_FRACTION)))
        profiler = StepProfiler(self.device, self.run_dir / PROFILE, first_step=step, start=step + warmup,
                                steps=min(PROFILE_STEPS, to_run - warmup) if t.profile else 0)  # fmt: skip
        step_ms: list[float] = []
        if self.dist.is_main:
            log.info("run directory: %s (%s, %s parameters, %s, %s)", self.run_dir, run_name(self.cfg),
                     f"{self.model.num_params():,}", device_name(self.device), str(self.dtype).removeprefix("torch."))
            window, context = self.cfg.model.window, self.cfg.model.block_size
            if window and window >= context:  # allowed (a sweep shortened to a small context), but said
                log.warning("model.window=%d covers the whole context (block_size=%d): the same function as "
                            "model.window=null", window, context)  # fmt: skip
        bar = tqdm(total=stop_at, initial=step, desc="train", unit="step", disable=not self.dist.is_main,
                   dynamic_ncols=True)  # fmt: skip
        status = "failed"  # until the loop ends: an exception leaves it so in run.json
        # Signals ask for a stop after the step; later ones are absorbed until the run has saved and closed.
        with StopSignals() as stop:
            try:
                with logging_redirect_tqdm():  # log lines go above the bar
                    if t.compile:
                        summary["compile_s"] = self.compile_warmup(step)
                    if self.dist.any(stop.requested, self.device):  # stopped while compiling: no step
                        stop_at = step
                    while step < stop_at:
                        start = time.perf_counter()
                        lr = lr_at(step, self.cfg.optim, t.max_steps)
                        for group in self.optimizer.param_groups:
                            group["lr"] = lr
                        with profiler.around(step + 1, step_ms):
                            loss, grad_norm = self.step(step)
                            step_ms.append((time.perf_counter() - start) * 1e3)
                        step += 1
                        step_s = step_ms[-1] / 1e3
                        if not math.isfinite(loss):
                            raise FloatingPointError(
                                f"train/loss became {loss} at step {step}; stopped without saving it. The last "
                                f"good checkpoint is {self.run_dir / LAST} (if one was written). Lower optim.lr, "
                                f"keep optim.grad_clip > 0, or use trainer.dtype=float32"
                            )
                        metrics = self.step_metrics(step, loss, grad_norm, lr, step_s)
                        if profiler.profiled(step):
                            metrics["perf/profiled"] = 1  # the profiler's overhead: no speed figure uses this step
                        else:
                            self.speeds.append(metrics["perf/tokens_per_sec"])
                        summary["train_loss"] = loss
                        if step == self.start_step + 1 and profiler.sdpa_backend and self.log is not None:
                            self.log.update_info(sdpa_backend=profiler.sdpa_backend)
                        self.record(step, metrics)
                        bar.update()
                        bar.set_postfix(progress_postfix(metrics), refresh=False)

                        stopping = self.dist.any(stop.requested, self.device) or step == stop_at
                        if step % t.eval_interval == 0 or step == t.max_steps:
                            summary.update(self.evaluate_and_keep_best(step))
                        if step % t.checkpoint_interval == 0 or stopping:
                            self.save(LAST, step)
                        if stopping:
                            break
                bar.close()
                profiler.finish()  # a run that ended inside the window still writes what it saw
                if profiler.summary is not None and self.dist.is_main:
                    log.info("where a step's time goes (%s):\n%s", profiler.out, summary_table(profiler.summary))
                summary["step"] = step
                summary["stopped_by"] = self.dist.broadcast(stop.signal if self.dist.is_main else None)
                if summary["stopped_by"] is None and step == t.stop_at_step < t.max_steps:
                    summary["stopped_by"] = continuation.STOP_AT_STEP
                elif summary["stopped_by"]:  # a SLURM job that is being requeued exits without a result
                    summary["requeued"] = self.dist.broadcast(
                        slurm.requeued_after(summary["stopped_by"], self.dist.rank) if self.dist.is_main else None)
                if self.dist.is_main:
                    if t.sample_tokens > 0 and step == t.max_steps:
                        self.log_sample(step, self.sample(t.sample_tokens))
                    self.report(summary, time.perf_counter() - started)
                status = "finished" if step == t.max_steps else "interrupted"
            finally:
                bar.close()
                if self.log is not None:
                    self.log.close(status, {k: summary[k] for k in FINAL_KEYS if k in summary})
        if self.log is not None and self.log.wandb_offline and self.wandb_segments:
            dirs = " ".join(shlex.quote(d) for d in self.wandb_segments)
            log.warning("wandb: this run continues an offline wandb run; upload its whole history with: python "
                        "rebuild_wandb.py %s, then wandb sync <the folder it prints> (wandb sync on the run's "
                        "offline-run folders would replace the first segment's history)", dirs)  # fmt: skip
        return summary

    def report(self, summary: dict, seconds: float) -> None:
        """The closing lines: where the run is, how it did, and what to do next."""
        step = summary["step"]
        if summary.get("stopped_by") == continuation.STOP_AT_STEP:
            log.info("stopped at step %d (trainer.stop_at_step): saved %s; trainer.resume=auto in this run "
                     "directory continues it to trainer.max_steps=%d", step, self.run_dir / LAST,
                     self.cfg.trainer.max_steps)  # fmt: skip
        elif summary.get("stopped_by"):
            then = ("SLURM requeues the job: its rerun continues from there" if summary.get("requeued")
                    else "trainer.resume=auto in this run directory continues it")  # fmt: skip
            log.warning("stopped by %s at step %d: saved %s; %s", summary["stopped_by"], step, self.run_dir / LAST,
                        then)  # fmt: skip
        lines = [f"run directory: {self.run_dir}", f"steps: {summary['start_step']} -> {step} in {seconds:,.1f} s"]
        if self.speeds:
            lines.append(f"median throughput: {statistics.median(self.speeds):,.0f} tokens/s")
        if self.best_step is not None:
            lines.append(f"best val/loss {self.best_val:.4f} (val/bpb {self.best_bpb:.4f}) at step {self.best_step}")
        saved = [name for name in (LAST, BEST) if (self.run_dir / name).exists()]
        lines.append("checkpoints: " + ", ".join(str(self.run_dir / name) for name in saved))
        lines.append(f"sample from it: python sample.py source={self.run_dir}")
        log.info("summary\n  " + "\n  ".join(lines))

    def compile_warmup(self, step: int) -> float:
        """Compile before the clock starts: one forward+backward, gradients discarded. Its time is
        logged as perf/compile_s and kept out of every speed and time-to-target figure."""
        if self.dist.is_main:
            log.info("compiling (trainer.compile_scope=%s): the first forward and backward pass, untimed",
                     self.cfg.trainer.compile_scope)
        start = time.perf_counter()
        x, y = self.step.loader.batch(step, 0)
        with autocast(self.device, self.dtype):
            loss = self.step.forward(x, y)[1]
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.dist.is_main:
            log.info("compiled in %.1f s", seconds)
        self.record(step, {"perf/compile_s": seconds})
        self.memory.reset()  # the compile's workspace is not the run's steady state
        return seconds

    def step_metrics(self, step: int, loss: float, grad_norm: float, lr: float, step_s: float) -> dict:
        metrics = {
            "train/loss": loss, "train/grad_norm": grad_norm, "lr": lr, "tokens": step * self.tokens_per_step,
            "perf/step_ms": step_s * 1e3, "perf/tokens_per_sec": self.tokens_per_step / step_s,
        }  # fmt: skip
        if self.peak is not None:
            per_gpu = self.tokens_per_step / step_s / self.dist.world_size
            metrics["perf/mfu"] = self.flops_per_token * per_gpu / self.peak
        if self.scaler is not None:
            metrics["train/loss_scale"] = self.scaler.get_scale()
        return {**metrics, **self.memory.read()}

    def record(self, step: int, metrics: dict) -> None:
        if self.log is not None:
            self.log.log(step, metrics)

    def evaluate_and_keep_best(self, step: int) -> dict:
        with eager():  # compiled blocks would compile again for inference: evaluation stays out of it
            metrics = self.evaluate(self.model)
        self.record(step, {**metrics, "tokens": step * self.tokens_per_step})
        if metrics["val/loss"] < self.best_val:
            self.best_val, self.best_bpb, self.best_step = metrics["val/loss"], metrics["val/bpb"], step
            self.save(BEST, step)
            if self.log is not None:
                self.log.best(step, metrics)
        if self.dist.is_main:
            best = (f"best {self.best_val:.4f} at step {self.best_step}" if self.best_step is not None
                    else f"best {self.best_val:.4f} before this run")  # fmt: skip
            log.info("step %d: val/loss %.4f, val/bpb %.4f (%s)", step, metrics["val/loss"], metrics["val/bpb"], best)
        return {"val_loss": metrics["val/loss"], "val_bpb": metrics["val/bpb"], "best_val_loss": self.best_val}

    def save(self, name: str, step: int) -> None:
        if not self.dist.is_main:
            return
        Checkpoint(
            model=self.model.state_dict(),  # the uncompiled, unwrapped module: no _orig_mod./module.
            model_config=asdict(self.model.config),
            tokenizer=self.cfg.data.tokenizer,
            step=step,
            best_val_loss=self.best_val,
            optimizer=self.optimizer.state_dict(),
            grad_scaler=self.scaler.state_dict() if self.scaler is not None else None,
            train_config=self.container,
            wandb_run_id=self.wandb_id,
        ).save(self.run_dir / name)

    def log_sample(self, step: int, text: str) -> None:
        log.info("sample (%d tokens from <|endoftext|>, temperature %s, top_k=%d, as sample.py's defaults):\n%s",
                 self.cfg.trainer.sample_tokens, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, text)  # fmt: skip
        if self.log is not None:
            self.log.sample(step, text)

    def sample(self, n_tokens: int) -> str:
        self.model.eval()
        generator = torch.Generator().manual_seed(self.cfg.trainer.seed)
        with eager(), autocast(self.device, self.dtype):
            ids = list(generate(self.model, [self.tokenizer.eot_id], n_tokens, temperature=DEFAULT_TEMPERATURE,
                                top_k=DEFAULT_TOP_K, generator=generator))  # fmt: skip
        return self.tokenizer.decode_bytes(ids).decode("utf-8", errors="replace")


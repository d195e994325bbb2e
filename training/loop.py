"""``train(cfg)``: the pure training function behind ``train.py``.

config -> the preflight (training/preflight.py: every refusal, the plan, the
device, the checkpoint to resume) -> data (prepared on demand, before any
process group exists) -> model + optimizer (or a checkpoint to resume) ->
steps -> metrics, evaluations and checkpoints in the run directory. Only
rank 0 writes.
"""

from __future__ import annotations

import logging
import math
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from common.machine_load import cores
from common.run_files import BEST, FAILURE, LAST, PROFILE, RUN_INFO, write_json
from common.warmup import MAX_WARMUP_STEPS, WARMUP_FRACTION
from data.loader import BatchLoader, PreparedData
from data.prepare import PreparationInterrupted, data_tokenizer, prepare
from model import GPT
from model.checkpoints.checkpoint import Checkpoint
from model.compiling import compile_for_training, eager
from model.config import context_notes
from model.decoding.generation import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, generate
from model.device import autocast, device_id, device_name, peak_flops
from training import continuation, slurm
from training.config import TrainConfig, grad_accum_steps
from training.distributed import Distributed, init_distributed
from training.evaluate import Evaluator, length_rows
from training.lengths import resolve_lengths
from training.memory import MemoryMeter, release_memory
from training.optim import described, make_optimizer, restore, set_learning_rates
from training.plan import for_tokenizer, read_lengths
from training.preflight import RunSetup, preflight, with_micro_batch
from training.profiling import PROFILE_STEPS, StepProfiler, name_cpu_kernels, summary_table
from training.run_log import RunDirClaim, claim_run_dir, open_run_log, record_failure, run_name
from training.signals import StopSignals
from training.speed_conditions import LoadWatch, compile_cache_counts
from training.step import TrainStep

log = logging.getLogger("headlab.train")
# What run.json keeps of a run's summary when it ends (a finished run's is returned when it is skipped).
FINAL_KEYS = ("step", "train_loss", "val_loss", "val_bpb", "best_val_loss", "stopped_by")


def train(cfg: DictConfig | TrainConfig) -> dict:
    """Train as ``cfg`` says; returns a summary (run_dir, step, last train/val loss, val bpb; ``stopped_by``
    a signal's name and ``requeued`` when a SLURM job is being requeued; ``signal`` the name of one that came
    as the run finished its last step, which stopped nothing)."""
    setup = preflight(cfg)  # everything that can be refused, before any work
    if not isinstance(setup, RunSetup):  # the plan, or a finished run skipped: the command's whole answer
        return setup
    return run(setup)


def run(setup: RunSetup) -> dict:
    """Data (prepared on demand, before any process group exists), the process group, the run directory,
    then the steps. A run out of memory is recorded as failed in its directory."""
    config, dist, device = setup.config, setup.dist, setup.device
    tokenizer = data_tokenizer(config.data)  # offline, its error covers the source's download too
    model_config = for_tokenizer(config.model, tokenizer.vocab_size, tokenizer.eot_id)
    try:
        data = PreparedData(prepare(config.data, tokenizer))  # every rank; a file lock makes one of them prepare
    except PreparationInterrupted:
        if slurm.in_slurm_job() and slurm.requeued_after("SIGTERM", dist.rank):
            log.warning("SLURM requeued the job while it prepared its data (nothing was kept): its rerun "
                        "prepares it again")  # fmt: skip
            return {"step": 0, "stopped_by": "SIGTERM", "requeued": True}
        raise
    data.check_fits(model_config.block_size, model_config.vocab_size)
    if model_config.document_masking:
        data.check_documents()
        if model_config.document_end != tokenizer.eot_id and dist.is_main:
            log.warning("model.document_end=%s is not the tokenizer's end-of-text (%s): a document ends where token %s "
                        "is, which the prepared data's documents do not end with", model_config.document_end,
                        tokenizer.eot_id, model_config.document_end)  # fmt: skip
    init_distributed(dist, device)
    finished, claim = False, None
    try:
        same_start_on_every_rank(dist, device, setup.resume.step if setup.resume is not None else 0)
        if setup.auto_micro:
            config = agreed_micro_batch(config, dist, device)
        t = config.trainer
        if dist.is_main:
            claim = claim_run_directory(setup, config)
        run_dir = Path(dist.broadcast(str(claim.path) if dist.is_main else None))
        resume = setup.resume
        earlier = continuation.earlier_run_dirs(t.resume, run_dir, setup.in_place) if resume is not None else []
        container = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
        # what the tokenizer filled in: the vocabulary, and document masking's end-of-text
        container["model"]["vocab_size"] = model_config.vocab_size
        container["model"]["document_end"] = model_config.document_end
        try:
            summary = Trainer(config, container, model_config, data, tokenizer, dist, device, setup.dtype,
                              grad_accum_steps(t, dist.world_size), run_dir, resume, setup.init_weights,
                              setup.started, earlier, setup.measured_anew).run()  # fmt: skip
            finished = True
            return summary
        except torch.OutOfMemoryError as err:
            half, detail = max(1, t.micro_batch_size // 2), str(err).splitlines()[0][:160]
            reason = f"out of memory at trainer.micro_batch_size={t.micro_batch_size}; try trainer.micro_batch_size={half} ({detail})"  # noqa: E501
        except NonFiniteLoss as err:  # diverged: a sweep's other variants go on, the report names why
            reason = str(err)
        # Out of the except block: the error's traceback (and the tensors its frames hold) is gone; the memory is
        # released as the run ends (below).
        if dist.is_main:
            record_failure(run_dir, container, config, reason)
        raise RunFailed(f"{run_name(config)}: {reason}; recorded in {run_dir / FAILURE}")
    finally:
        dist.close(finished)
        if claim is not None:
            claim.release()
        release_memory(device, config.trainer.compile)  # the next job of a multirun starts on a clean device


def same_start_on_every_rank(dist: Distributed, device: torch.device, step: int) -> None:
    """Every rank starts from the step rank 0 starts from: a rank that found another checkpoint (or none) to
    continue would train other steps, and the ranks would wait for each other forever."""
    if not dist.enabled:
        return
    main_step = dist.broadcast(step)
    if dist.any(step != main_step, device):
        raise ValueError(f"the ranks would continue from different steps (rank 0 from step {main_step}, "
                         f"rank {dist.rank} from step {step}): each read another run directory. Name the run "
                         f"directory in the torchrun command (hydra.run.dir=<dir>, as the printed continue command "
                         f"does, or trainer.run_dir=<dir>) so that every rank reads it")  # fmt: skip


def agreed_micro_batch(config: TrainConfig, dist: Distributed, device: torch.device) -> TrainConfig:
    """``trainer.micro_batch_size=auto``: every rank must accumulate the same number of micro-steps, so all
    take the smallest rank's pick."""
    config = with_micro_batch(config, dist.min(config.trainer.micro_batch_size, device))
    if dist.is_main:
        log.info("trainer.micro_batch_size=auto: %d sequences per forward pass (%d accumulation step(s))",
                 config.trainer.micro_batch_size, grad_accum_steps(config.trainer, dist.world_size))
    return config


def claim_run_directory(setup: RunSetup, config: TrainConfig) -> RunDirClaim:
    """Rank 0 claims the run directory and says where the run continues from. Continuing in place, what the
    stopped run logged after its checkpoint is dropped: it is computed again."""
    t, resume = config.trainer, setup.resume
    claim = claim_run_dir(t.run_dir, continuing=setup.in_place, resume_auto=t.resume == "auto")
    if setup.in_place:
        continuation.prepare_in_place(claim.path, resume.step if resume is not None else -1)
    if resume is not None:
        source = claim.path if setup.in_place else t.resume
        log.info(continuation.describe(source, resume, t.max_steps, config.optim, claim.path))
    elif setup.in_place:
        log.info("continuing %s from the start (it was stopped before its first checkpoint)", claim.path)
    return claim


def progress_postfix(metrics: dict) -> dict:
    postfix = {"loss": f"{metrics['train/loss']:.4f}", "tok/s": f"{metrics['perf/tokens_per_sec']:,.0f}"}
    if "perf/mfu" in metrics:
        postfix["mfu"] = f"{metrics['perf/mfu']:.1%}"
    return postfix


class RunFailed(RuntimeError):
    """A run that could not finish (e.g. out of memory); its reason is recorded in the run directory."""


class NonFiniteLoss(FloatingPointError):
    """The training loss became NaN or infinite: the run stops before it saves anything of that step."""


class Trainer:
    """Holds a run's parts; ``run`` is the loop."""

    def __init__(self, cfg: TrainConfig, container: dict, model_config, data: PreparedData, tokenizer,
                 dist: Distributed, device: torch.device, dtype: torch.dtype, grad_accum: int, run_dir: Path,
                 resume: Checkpoint | None, init_weights: dict | None = None,
                 started: float | None = None, earlier_dirs: list[str] = (),
                 measured_anew: tuple[str, ...] = ()) -> None:  # fmt: skip
        t = cfg.trainer
        self.cfg, self.container, self.tokenizer, self.dist = cfg, container, tokenizer, dist
        self.device, self.dtype, self.run_dir = device, dtype, run_dir
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.memory = MemoryMeter(device)
        self.load = LoadWatch(is_main=dist.is_main)  # the cores other processes use: the speed figures' conditions

        torch.manual_seed(t.seed)  # the same initial weights on every rank, and in every layout
        self.model = GPT(model_config)
        self.model.loss_chunk = t.loss_chunk
        if init_weights is not None:
            self.model.load_weights(init_weights)
        self.model.to(device)
        self.optimizer = make_optimizer(self.model, cfg.optim, device, dtype)
        self.scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        self.start_step, self.best_val, self.best_bpb, wandb_id = 0, math.inf, math.nan, None
        self.speeds: list[float] = []
        if resume is not None:
            self.model.load_weights(resume.model)
            restore(self.optimizer, resume.optimizer)  # its state; this run's settings
            if self.scaler is not None and resume.grad_scaler:
                self.scaler.load_state_dict(resume.grad_scaler)
            self.start_step, self.best_val, wandb_id = resume.step, resume.best_val_loss, resume.wandb_run_id
            if measured_anew:  # another measure of val/loss: neither the old curve nor the old best is comparable
                self.best_val, wandb_id = math.inf, None
                if dist.is_main:
                    log.info("val/loss is measured anew (%s): a new validation curve (a new wandb run) and its own "
                             "best", ", ".join(measured_anew))  # fmt: skip
        self.wandb_id = wandb_id  # kept across resumes, even by a resumed run that logs without wandb

        if t.profile and t.compile and device.type == "cpu":
            name_cpu_kernels()
        forward = compile_for_training(self.model, t.compile_scope, t.compile_mode) if t.compile else self.model
        if dist.enabled:
            forward = DistributedDataParallel(forward, device_ids=[device.index] if device.type == "cuda" else None)
        loader = BatchLoader(data.tokens["train"], model_config.block_size, t.batch_size, t.seed, dist.rank,
                             dist.world_size, device, t.micro_batch_size)  # fmt: skip
        self.step = TrainStep(self.model, forward, self.optimizer, loader, grad_accum, cfg.optim.grad_clip,
                              t.seed, dtype, dist, self.scaler,
                              graphs_replayed=t.compile and t.compile_mode == "reduce-overhead",
                              indexer_warmup=t.indexer_warmup)  # fmt: skip
        self.evaluate = Evaluator(data.tokens["val"], model_config.block_size, t.eval_windows, t.micro_batch_size,
                                  data.bytes_per_token("val"), device, dtype, dist)  # fmt: skip
        self.val_tokens, self.val_bytes_per_token = data.tokens["val"], data.bytes_per_token("val")
        self.tokens_per_step = t.batch_size * model_config.block_size
        self.flops_per_token = self.model.flops_per_token()
        self.peak = peak_flops(device, dtype)
        facts = {
            "params": self.model.num_params(), "params_non_embedding": self.model.num_params(non_embedding=True),
            "world_size": dist.world_size, "device_name": device_name(device), "cores": cores(),
            "dtype": str(dtype).removeprefix("torch."), "data_dir": str(data.folder),
            "tokens_per_step": self.tokens_per_step, "continues": list(earlier_dirs),
        }  # fmt: skip
        # an offline wandb run continued: its segments are separate offline runs that wandb sync cannot merge
        self.wandb_segments = [*earlier_dirs, str(run_dir)] if resume is not None and wandb_id else None
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
            trained = described(self.optimizer, self.cfg.optim, t.max_steps)  # Muon, or a schedule other than cosine
            if trained:
                log.info(trained)
            for note in context_notes(self.model.config):  # a window that covers the context, or sees only itself
                log.warning(note)
            if t.indexer_warmup >= t.max_steps:  # a preset shortened for a try: allowed, but not what it says
                log.warning("trainer.indexer_warmup=%d covers all %d steps of the run: its attention stays dense "
                            "throughout (sparse attention selects from step %d on)", t.indexer_warmup, t.max_steps,
                            t.indexer_warmup)  # fmt: skip
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
                        rates = set_learning_rates(self.optimizer, step, self.cfg.optim, t.max_steps)
                        with profiler.around(step + 1, step_ms):
                            loss, grad_norm = self.step(step)
                            step_ms.append((time.perf_counter() - start) * 1e3)
                        step += 1
                        step_s = step_ms[-1] / 1e3
                        if not math.isfinite(loss):
                            last = self.run_dir / LAST
                            saved = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint yet"
                            lower = "optim.lr" + (" or optim.muon_lr" if "lr/muon" in rates else "")
                            raise NonFiniteLoss(f"train/loss became {loss} at step {step}; stopped without saving "
                                                f"it ({saved}). Lower {lower}, keep optim.grad_clip > 0, or use "
                                                f"trainer.dtype=float32")  # fmt: skip
                        metrics = self.step_metrics(step, loss, grad_norm, rates, step_s)
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
                signalled = self.dist.broadcast(stop.signal if self.dist.is_main else None)
                if step == t.max_steps and signalled:  # it came during the last step: the run is finished
                    summary["signal"] = signalled
                summary["stopped_by"] = None if step == t.max_steps else signalled
                if summary["stopped_by"] is None and step == t.stop_at_step < t.max_steps:
                    summary["stopped_by"] = continuation.STOP_AT_STEP
                elif summary["stopped_by"]:  # a SLURM job that is being requeued exits without a result
                    summary["requeued"] = self.dist.broadcast(
                        slurm.requeued_after(summary["stopped_by"], self.dist.rank) if self.dist.is_main else None)
                if self.dist.is_main:
                    if t.sample_tokens > 0 and step == t.max_steps:
                        self.log_sample(step, self.sample(t.sample_tokens))
                    if t.eval_lengths is not None and step == t.max_steps:
                        self.evaluate_lengths(step)
                seconds = time.perf_counter() - started
                status = "finished" if step == t.max_steps else "interrupted"
            finally:
                bar.close()
                if self.log is not None:
                    self.close_log(status, {k: summary[k] for k in FINAL_KEYS if k in summary}, sys.exc_info()[1])
        if self.log is not None and self.log.wandb_offline and self.wandb_segments:
            dirs = " ".join(shlex.quote(d) for d in self.wandb_segments)
            log.warning("wandb: this run continues an offline wandb run; upload its whole history with: python "
                        "rebuild_wandb.py %s, then wandb sync <the folder it prints> (wandb sync on the run's "
                        "offline-run folders would replace the first segment's history)", dirs)  # fmt: skip
        if self.dist.is_main:  # after wandb's closing lines, which would bury it: the run's last words
            self.report(summary, seconds)
        return summary

    def close_log(self, status: str, summary: dict, failing: BaseException | None) -> None:
        """Record how the run ended. Where it ends on an error (a disk that filled up while a checkpoint was
        written), a second error from recording it must not bury the first: it is said, and the first goes on."""
        try:
            self.log.close(status, summary)
        except OSError as err:
            if failing is None:
                raise
            log.error("could not record in %s that the run %s (%s)", self.run_dir / RUN_INFO, status, err)

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
        elif summary.get("signal"):
            log.warning("%s came as the run finished its last step: it is finished, nothing was cut short",
                        summary["signal"])  # fmt: skip
        lines = [f"run directory: {self.run_dir}", f"steps: {summary['start_step']} -> {step} in {seconds:,.1f} s"]
        if self.speeds:
            lines.append(f"median throughput: {statistics.median(self.speeds):,.0f} tokens/s{self.load.caution()}")
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
            log.info("compiling (trainer.compile_scope=%s, compile_mode=%s): the first forward and backward pass, "
                     "untimed", self.cfg.trainer.compile_scope, self.cfg.trainer.compile_mode)
        start, cache = time.perf_counter(), compile_cache_counts()
        x, y = self.step.loader.batch(step, 0)
        if self.step.graphs_replayed:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(self.device, self.dtype):
            loss = self.step.forward(x, y)[1]
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.dist.is_main:
            log.info("compiled in %.1f s", seconds)
        hits, misses = (now - before for now, before in zip(compile_cache_counts(), cache))
        if self.dist.is_main and hits:
            log.info("compile: %d of %d graphs read from the compile cache (an earlier run or job compiled them): "
                     "this compile time is not a cold one", hits, hits + misses)  # fmt: skip
        self.record(step, {"perf/compile_s": seconds, "perf/compile_cache_hits": hits,
                           "perf/compile_cache_misses": misses})  # fmt: skip
        self.memory.reset()  # the compile's workspace is not the run's steady state
        return seconds

    def step_metrics(self, step: int, loss: float, grad_norm: float, rates: dict, step_s: float) -> dict:
        metrics = {
            "train/loss": loss, "train/grad_norm": grad_norm, **rates, "tokens": step * self.tokens_per_step,
            "perf/step_ms": step_s * 1e3, "perf/tokens_per_sec": self.tokens_per_step / step_s,
        }  # fmt: skip
        if self.peak is not None:
            per_gpu = self.tokens_per_step / step_s / self.dist.world_size
            metrics["perf/mfu"] = self.flops_per_token * per_gpu / self.peak
        if self.scaler is not None:
            metrics["train/loss_scale"] = self.scaler.get_scale()
        if self.step.indexer_kl is not None:  # sparse attention's indexers: their KL to the attention, per layer
            metrics["train/indexer_kl"] = self.step.indexer_kl
        return {**metrics, **self.memory.read(), **self.load.step()}

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

    def evaluate_lengths(self, step: int) -> None:
        """trainer.eval_lengths: the final model read past its trained length by each protocol and rule, as
        evaluate.py lengths=[...] does: eval-final-<protocol>-<past_context>.json beside the checkpoints."""
        t, config = self.cfg.trainer, self.model.config
        lengths, asked = read_lengths(t, config), resolve_lengths(t.eval_lengths, config.block_size)
        skipped = [n for n in asked if n not in lengths]
        if skipped:
            log.warning("trainer.eval_lengths: %s skipped: model.position=%s has a table of block_size=%d rows",
                        skipped, config.position, config.block_size)  # fmt: skip
        batch_tokens = (self.evaluate.batch_size or t.batch_size) * config.block_size
        for protocol in t.eval_protocols:
            for past_context in t.eval_past_contexts:
                with eager():
                    rows = length_rows(self.model, self.val_tokens, lengths, protocol, past_context, t.eval_windows,
                                       None, batch_tokens, self.val_bytes_per_token, self.device, self.dtype,
                                       span=t.eval_windows * max(asked))  # the stretch of every run of a sweep
                result = {"lengths": rows, "source": str(self.run_dir), "step": step, "block_size": config.block_size,
                          "data": self.cfg.data.name, "rope_scaling": config.rope_scaling}  # fmt: skip
                write_json(self.run_dir / f"eval-final-{protocol}-{past_context}.json", result)
                losses = ", ".join(f"{row['length']}: {row['loss']:.4f}" for row in rows)
                log.info("past the trained length (%s, past_context=%s): loss at %s", protocol, past_context, losses)

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


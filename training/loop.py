"""``train(cfg)``: the pure training function behind ``train.py``.

config -> data (prepared on demand) -> model + optimizer (or a checkpoint to
resume) -> steps with gradient accumulation -> metrics, evaluations and
checkpoints in the run directory. Only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import math
import resource
import signal
import time
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data.loader import BatchLoader, PreparedData, validation_starts, windows
from data.prepare import prepare
from data.tokenizers import get_tokenizer
from model import GPT, GPTConfig
from model.generation import generate
from training.checkpoint import BEST, LAST, load_checkpoint, save_checkpoint
from training.config import TrainConfig, grad_accum_steps, validate
from training.distributed import Distributed, init_distributed
from training.hardware import autocast, device_name, peak_flops, resolve_device, resolve_dtype
from training.optim import lr_at, make_optimizer
from training.run_log import RunLog, atomic_write_json, start_wandb, wandb_mode

# Fields of the model config that must agree with a checkpoint to resume from it.
_SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "bias")


def train(cfg: DictConfig | TrainConfig) -> dict:
    """Train as ``cfg`` says; returns a summary (run_dir, step, last train/val loss, val bpb)."""
    config: TrainConfig = cfg if isinstance(cfg, TrainConfig) else OmegaConf.to_object(cfg)
    validate(config)
    container = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    wants_cuda = config.trainer.device.startswith("cuda") or (
        config.trainer.device == "auto" and torch.cuda.is_available()
    )
    dist = init_distributed(wants_cuda)
    try:
        return Trainer(config, container, dist).run()
    finally:
        dist.close()


class Trainer:
    def __init__(self, cfg: TrainConfig, container: dict, dist: Distributed) -> None:
        self.cfg, self.container, self.dist = cfg, container, dist
        t = cfg.trainer
        # Everything that can be refused is checked before data preparation or model building.
        self.device = resolve_device(t.device, dist.local_rank)
        self.dtype = resolve_dtype(t.dtype, self.device)
        self.grad_accum = grad_accum_steps(t, dist.world_size)
        self.resume = load_checkpoint(t.resume) if t.resume else None
        if self.resume is not None:
            self._check_resumable(self.resume)
        self.run_dir = self._run_dir()
        self.stop_requested = False

    # ---------------------------------------------------------------- set-up

    def _check_resumable(self, ckpt: dict) -> None:
        saved = ckpt["config"]
        mismatched = [
            f"model.{k}: checkpoint {saved['model'][k]!r} vs now {getattr(self.cfg.model, k)!r}"
            for k in _SHAPE_FIELDS
            if saved["model"][k] != getattr(self.cfg.model, k)
        ]
        if saved["attention"]["layout"] != self.cfg.attention.layout:
            mismatched.append(
                f"attention.layout: checkpoint {saved['attention']['layout']!r} vs now {self.cfg.attention.layout!r}"
            )
        if mismatched:
            raise ValueError(
                f"cannot resume from {self.cfg.trainer.resume}: its config differs: "
                + "; ".join(mismatched)
                + ". Resume with the checkpoint's settings (see its config), or start a new run"
            )

    def _run_dir(self) -> Path:
        if self.cfg.trainer.run_dir:
            run_dir = self.cfg.trainer.run_dir
        else:
            from hydra.core.hydra_config import HydraConfig

            if not HydraConfig.initialized():
                raise ValueError("trainer.run_dir is not set and Hydra is not running; set trainer.run_dir")
            run_dir = HydraConfig.get().runtime.output_dir
        run_dir = Path(self.dist.broadcast(str(Path(run_dir).resolve())))  # one directory for all ranks
        if self.dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir

    def _data(self) -> PreparedData:
        tokenizer = get_tokenizer(self.cfg.data.tokenizer)
        if self.dist.is_main:
            folder = prepare(self.cfg.data, tokenizer)
        self.dist.barrier()  # other ranks wait for rank 0's preparation, then find the same folder
        if not self.dist.is_main:
            folder = prepare(self.cfg.data, tokenizer)
        data = PreparedData(folder)
        self.tokenizer = tokenizer
        return data

    def _model_config(self, data: PreparedData) -> GPTConfig:
        m = self.cfg.model
        vocab_size = m.vocab_size if m.vocab_size is not None else data.vocab_size
        data.check_fits(m.block_size, vocab_size)
        return GPTConfig(
            vocab_size=vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
            n_embd=m.n_embd, dropout=m.dropout, bias=m.bias,
            attention=self.cfg.attention.layout, kernel=self.cfg.attention.kernel,
        )  # fmt: skip

    # ---------------------------------------------------------------- the run

    def run(self) -> dict:
        cfg, t, dist = self.cfg, self.cfg.trainer, self.dist
        data = self._data()
        torch.manual_seed(t.seed)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.cuda.reset_peak_memory_stats(self.device)
        model = GPT(self._model_config(data)).to(self.device)
        optimizer = make_optimizer(model, cfg.optim, self.device)
        step, best_val, wandb_id = 0, math.inf, None
        if self.resume is not None:
            model.load_weights(self.resume["model"])
            optimizer.load_state_dict(self.resume["optimizer"])
            step, best_val = self.resume["step"], self.resume["best_val_loss"]
            wandb_id = self.resume.get("wandb_run_id")
            torch.set_rng_state(self.resume["rng"]["torch"])
            if self.device.type == "cuda" and self.resume["rng"].get("cuda") is not None:
                torch.cuda.set_rng_state(self.resume["rng"]["cuda"], self.device)
        self.model = model
        forward = model
        if t.compile:
            torch._dynamo.reset()  # a multirun's previous job may have left compiled graphs
            forward = torch.compile(model)
        if dist.enabled:
            forward = DistributedDataParallel(
                forward, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )

        loader = BatchLoader(data.tokens["train"], cfg.model.block_size, t.micro_batch_size, t.seed,
                             dist.rank, dist.world_size, self.device)  # fmt: skip
        val_starts = validation_starts(len(data.tokens["val"]), cfg.model.block_size, t.eval_windows)
        self.val_tokens, self.val_starts = data.tokens["val"], val_starts[dist.rank :: dist.world_size]
        self.bytes_per_token = data.bytes_per_token("val")
        tokens_per_step = t.batch_size * cfg.model.block_size
        flops_per_token = model.flops_per_token()
        peak = peak_flops(self.device, self.dtype)

        log = self._open_log(model, data, wandb_id) if dist.is_main else None
        self.optimizer, self.log, self.best_val = optimizer, log, best_val
        stop_at = t.stop_at_step or t.max_steps
        summary: dict = {"run_dir": str(self.run_dir), "start_step": step}
        bar = tqdm(total=stop_at, initial=step, desc="train", unit="step", disable=not dist.is_main,
                   dynamic_ncols=True)  # fmt: skip
        previous_handlers = self._catch_stop_signals()
        try:
            while step < stop_at:
                start = time.perf_counter()
                lr = lr_at(step, cfg.optim, t.max_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss = self._train_step(forward, loader, step)
                step += 1
                step_s = time.perf_counter() - start
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"train/loss became {loss} at step {step}; stopped without saving it. The last "
                        f"good checkpoint is {self.run_dir / LAST} (if one was written). Lower optim.lr, "
                        f"keep optim.grad_clip > 0, or use trainer.dtype=float32"
                    )
                metrics = {
                    "train/loss": loss, "lr": lr, "tokens": step * tokens_per_step,
                    "perf/step_ms": step_s * 1e3, "perf/tokens_per_sec": tokens_per_step / step_s,
                }  # fmt: skip
                if peak is not None:
                    per_gpu = tokens_per_step / step_s / dist.world_size
                    metrics["perf/mfu"] = flops_per_token * per_gpu / peak
                metrics.update(self._memory())
                summary["train_loss"] = loss
                if log is not None:
                    log.log(step, metrics)
                bar.update()
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{metrics['perf/tokens_per_sec']:,.0f}")

                stopping = dist.any(self.stop_requested, self.device) or step == stop_at
                if step % t.eval_interval == 0 or step == t.max_steps:
                    summary.update(self._evaluate(step))
                if step % t.checkpoint_interval == 0 or stopping:
                    self._save(LAST, step)
                if stopping:
                    break
        finally:
            bar.close()
            self._restore_signals(previous_handlers)
            if log is not None:
                log.close()
        summary["step"] = step
        summary["interrupted"] = self.stop_requested
        if dist.is_main and t.sample_tokens > 0 and step == t.max_steps:
            print(f"\n--- sample ({t.sample_tokens} tokens) ---\n{self._sample(t.sample_tokens)}\n---")
        return summary

    def _train_step(self, forward, loader: BatchLoader, step: int) -> float:
        """One optimizer step over ``grad_accum`` micro-batches; returns the mean loss over all ranks."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)  # summed on the device: no sync per micro-step
        for micro in range(self.grad_accum):
            x, y = loader.batch(step, micro)
            last = micro == self.grad_accum - 1
            # DDP all-reduces gradients on the last micro-step only.
            sync = contextlib.nullcontext() if last or not self.dist.enabled else forward.no_sync()
            with sync:
                with autocast(self.device, self.dtype):
                    _, loss = forward(x, y)
                (loss / self.grad_accum).backward()
            total += loss.detach()
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self.dist.mean(total.item() / self.grad_accum, self.device)

    @torch.no_grad()
    def _evaluate(self, step: int) -> dict:
        """Mean loss over the fixed validation windows (shared out over ranks) and bits per byte."""
        self.model.eval()
        block, batch = self.cfg.model.block_size, self.cfg.trainer.micro_batch_size
        total, count = 0.0, 0
        for i in range(0, len(self.val_starts), batch):
            x, y = windows(self.val_tokens, self.val_starts[i : i + batch], block, self.device)
            with autocast(self.device, self.dtype):
                _, loss = self.model(x, y)
            total += loss.item() * len(x)
            count += len(x)
        self.model.train()
        total, count = self.dist.sum([total, count], self.device)  # ranks may hold unequal shares
        val_loss = total / count
        # nats per token -> bits per byte of text
        metrics = {"val/loss": val_loss, "val/bpb": val_loss / math.log(2) / self.bytes_per_token}
        if self.log is not None:
            self.log.log(step, metrics)
        if val_loss < self.best_val:
            self.best_val = val_loss
            self._save(BEST, step)
        return {"val_loss": val_loss, "val_bpb": metrics["val/bpb"], "best_val_loss": self.best_val}

    def _save(self, name: str, step: int) -> None:
        if not self.dist.is_main:
            return
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        payload = {
            "model": self.model.state_dict(),  # the uncompiled, unwrapped module: no _orig_mod./module.
            "model_config": asdict(self.model.config),
            "optimizer": self.optimizer.state_dict(),
            "step": step,
            "tokens_seen": step * self.cfg.trainer.batch_size * self.cfg.model.block_size,
            "best_val_loss": self.best_val,
            "rng": rng,
            "loader": {"seed": self.cfg.trainer.seed, "next_step": step},
            "config": self.container,
            "tokenizer": self.cfg.data.tokenizer,
            "wandb_run_id": self.wandb_id,
        }
        save_checkpoint(payload, self.run_dir / name)

    def _open_log(self, model: GPT, data: PreparedData, wandb_id: str | None) -> RunLog:
        """Write ``run.json`` (what this run is, for reports) and start wandb with the same facts."""
        cfg = self.cfg
        layout, kernel = cfg.attention.layout, cfg.attention.kernel
        info = {
            **self.container,
            "name": f"{layout}-{kernel}-{cfg.model.name}",
            "group": self._wandb_group(),
            "params": model.num_params(),
            "params_non_embedding": model.num_params(non_embedding=True),
            "world_size": self.dist.world_size,
            "device_name": device_name(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "data_dir": str(data.folder),
            "tokens_per_step": cfg.trainer.batch_size * cfg.model.block_size,
        }
        atomic_write_json(self.run_dir / "run.json", info)
        self.wandb_id = wandb_id
        run = None
        if cfg.logger.kind == "wandb":
            tags = [layout, kernel, cfg.model.name, cfg.data.name, *cfg.logger.tags]
            run = start_wandb(cfg.logger, wandb_mode(cfg.logger), self.run_dir, info["name"],
                              info["group"], tags, info, wandb_id)  # fmt: skip
            self.wandb_id = run.id
        return RunLog(self.run_dir, run)

    def _wandb_group(self) -> str | None:
        if self.cfg.logger.group:
            return self.cfg.logger.group
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            sweep_dir = Path(HydraConfig.get().sweep.dir)
            return f"sweep-{sweep_dir.parent.name}_{sweep_dir.name}"  # one group per multirun
        return None

    def _memory(self) -> dict:
        if self.device.type == "cuda":
            return {"perf/peak_mem_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}
        return {"perf/max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def _sample(self, n_tokens: int) -> str:
        self.model.eval()
        generator = torch.Generator().manual_seed(self.cfg.trainer.seed)
        with autocast(self.device, self.dtype):
            ids = list(generate(self.model, [self.tokenizer.eot_id], n_tokens, temperature=1.0,
                                top_k=50, generator=generator))  # fmt: skip
        return self.tokenizer.decode_bytes(ids).decode("utf-8", errors="replace")

    def _catch_stop_signals(self) -> dict:
        """SIGINT/SIGTERM finish the current step, save, and end the run cleanly."""

        def request_stop(signum, frame):
            self.stop_requested = True

        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                handlers[sig] = signal.signal(sig, request_stop)
        return handlers

    @staticmethod
    def _restore_signals(handlers: dict) -> None:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)

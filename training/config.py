"""Structured configs for `train.py`: one dataclass per config group, validated by Hydra.

The ``model`` group is ``model.GPTConfig`` itself: the model's shape and its
attention layout and kernel are declared once, there. Every default lives in
these dataclasses; the YAML files in ``configs/`` change only what differs.

A typo in a key or a wrong type is rejected by OmegaConf when the config is
composed; the dataclasses' own checks and ``validate`` then refuse what types
cannot (ranges, choices, combinations) before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from common.optim_label import OPTIM_DEFAULTS
from data.config import DataConfig, check_data_config
from model.compiling import COMPILE_MODES, COMPILE_SCOPES
from model.config import GPTConfig, making_sparse
from model.decoding.context import check_past_context
from model.device import DTYPES
from training.lengths import check_protocol, length_spellings
from training.muon import check_split

OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "wsd", "constant")
DECAY_SHAPES = ("linear", "1-sqrt")
MUON_SPLITS = ("as_stored", "qkv", "heads")
MUON_LR_ADJUSTMENTS = ("original", "match_rms_adamw", "none")


@dataclass
class OptimConfig:
    # adamw | muon (Muon for the hidden matrices, AdamW for embeddings, norms, biases and scalars: training/muon.py).
    # Its state is what a resume keeps: another is refused (init_from starts a new optimizer from the weights)
    name: str = field(default=OPTIM_DEFAULTS["name"], metadata={"reuse": "optimizer"})
    lr: float = 2e-3  # AdamW's peak learning rate, reached after warmup (with Muon: its AdamW parameters')
    min_lr: float = 2e-4  # where the decay ends (cosine, wsd); Muon's lr decays by the same factor
    warmup_steps: int = 30
    # cosine (warmup, then cosine decay to min_lr at max_steps) | wsd (warmup, constant, then a decay over the final
    # decay_fraction of the steps: a checkpoint of the constant phase serves any larger budget) | constant
    schedule: str = OPTIM_DEFAULTS["schedule"]
    decay_fraction: float = OPTIM_DEFAULTS["decay_fraction"]  # wsd: the share of max_steps its decay takes, at the end
    decay_shape: str = OPTIM_DEFAULTS["decay_shape"]  # wsd: linear | 1-sqrt (1 - sqrt(progress))
    weight_decay: float = 0.1  # AdamW's, on matmul weights only, not biases, norms or embeddings
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    # optim=muon: the hidden matrices' optimizer (torch.optim.Muon's options). Its peak learning rate, momentum,
    # Nesterov momentum, Newton-Schulz steps, the learning rate's adjustment by a matrix's shape (original:
    # sqrt(max(1, rows/cols)), Keller Jordan's; match_rms_adamw: 0.2 sqrt(max(rows, cols)), Moonshot's; none) and
    # decoupled weight decay (its lr times this, per step)
    muon_lr: float = OPTIM_DEFAULTS["muon_lr"]
    muon_momentum: float = OPTIM_DEFAULTS["muon_momentum"]
    muon_nesterov: bool = OPTIM_DEFAULTS["muon_nesterov"]
    muon_ns_steps: int = OPTIM_DEFAULTS["muon_ns_steps"]
    muon_adjust_lr: str = OPTIM_DEFAULTS["muon_adjust_lr"]
    muon_weight_decay: float = OPTIM_DEFAULTS["muon_weight_decay"]
    # Which matrices Muon orthogonalises: as_stored (each weight as its layout stores it: fused_qkv's one 3C x C,
    # separate_qkv's three C x C, the wrapper's per head), qkv (Q, K and V apart in every layout: the layouts take the
    # same steps) or heads (each head's Q, K and V apart); model/*'s matrix_rows say how each layer's split
    muon_split: str = OPTIM_DEFAULTS["muon_split"]

    def __post_init__(self) -> None:
        check_optimizer(self)  # as the config is made: each job of a sweep before the first starts (cli/sweep_start.py)


def check_optimizer(o: OptimConfig) -> None:
    """The optimizer's and the schedule's choices and ranges, and no option of one that is not in use (a Muon option
    with AdamW, a decay's shape without wsd): each refused naming the value and the fix."""
    choices = {"name": OPTIMIZERS, "schedule": LR_SCHEDULES, "decay_shape": DECAY_SHAPES, "muon_split": MUON_SPLITS,
               "muon_adjust_lr": MUON_LR_ADJUSTMENTS}  # fmt: skip
    for name, allowed in choices.items():
        if getattr(o, name) not in allowed:
            group = " (or the group: optim=adamw, muon, muon_qkv, muon_heads)" if name == "name" else ""
            raise ValueError(f"optim.{name}={getattr(o, name)!r}; choose one of: {', '.join(allowed)}{group}")
    if not 0 < o.decay_fraction <= 1:
        raise ValueError(f"optim.decay_fraction={o.decay_fraction}: the share of trainer.max_steps that wsd's decay "
                         f"takes at the end, in (0, 1] (0.2: the last fifth)")  # fmt: skip
    if o.schedule != "wsd":
        for name in ("decay_fraction", "decay_shape"):
            if getattr(o, name) != OPTIM_DEFAULTS[name]:
                raise ValueError(f"optim.{name}={getattr(o, name)} shapes the wsd schedule's decay, but "
                                 f"optim.schedule={o.schedule}; set optim.schedule=wsd, or leave optim.{name} at "
                                 f"{OPTIM_DEFAULTS[name]}")  # fmt: skip
    if o.schedule == "constant" and o.min_lr != OptimConfig.min_lr:
        raise ValueError(f"optim.min_lr={o.min_lr} is where a decay ends, but optim.schedule=constant has none; set "
                         f"optim.schedule=cosine or wsd, or leave optim.min_lr at {OptimConfig.min_lr}")  # fmt: skip
    if o.name != "muon":
        for name in (f.name for f in fields(OptimConfig) if f.name.startswith("muon_")):
            if getattr(o, name) != OPTIM_DEFAULTS[name]:
                raise ValueError(f"optim.{name}={getattr(o, name)} is an option of Muon, but optim.name={o.name}; use "
                                 f"optim=muon, or leave optim.{name} at its default "
                                 f"({OPTIM_DEFAULTS[name]})")  # fmt: skip
        return
    if not o.muon_lr > 0 or o.muon_weight_decay < 0:  # NaN is refused too
        raise ValueError(f"optim.muon_lr={o.muon_lr}, optim.muon_weight_decay={o.muon_weight_decay}: Muon's peak "
                         f"learning rate must be > 0 (0.02: Keller Jordan's, nanochat's) and its weight decay >= 0")
    if not 0 <= o.muon_momentum < 1:
        raise ValueError(f"optim.muon_momentum={o.muon_momentum} must be in [0, 1) (0.95: torch.optim.Muon's)")
    if not 1 <= o.muon_ns_steps < 100:
        raise ValueError(f"optim.muon_ns_steps={o.muon_ns_steps}: Newton-Schulz iterations, a whole number in 1..99 "
                         f"(5: torch.optim.Muon's, Keller Jordan's)")  # fmt: skip


@dataclass
class TrainerConfig:
    # optimizer steps; the learning-rate schedule spans them. A larger one extends a run (resume, resume=auto)
    max_steps: int = field(default=1000, metadata={"reuse": "budget"})
    # sequences per optimizer step, over all ranks and micro-steps
    batch_size: int = field(default=16, metadata={"reuse": "training"})
    # Sequences per forward pass on one rank: null (a rank's whole share, batch_size / ranks: the same run on
    # 1, 2, 4 or 8 ranks), a number (gradient accumulation makes up the share), or auto (the largest the plan fits)
    micro_batch_size: Any = None
    eval_interval: int = 200  # steps between evaluations (and best/last checkpoints)
    # fixed validation windows per evaluation: how val/loss is measured (a continuation keeps it)
    eval_windows: int = field(default=64, metadata={"reuse": "measure"})
    checkpoint_interval: int = 200  # steps between 'last' checkpoints
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on Ampere+, fp16 on older GPUs, float32 on CPU) | float32 | bfloat16 | float16
    compile: bool = False
    compile_scope: str = "block"  # block: each transformer block compiled once and reused | model: one graph
    # inductor's mode: default | reduce-overhead (each graph replayed as a CUDA graph) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # tokens per chunk of the LM head and loss computed together, gradients made in the forward pass
    # (model/chunked_loss.py): never the whole (tokens, vocab) float32 logits; 0: the whole logits at once
    loss_chunk: int = 0
    # Sparse attention (model.sparse_topk): steps of dense attention at the start while the indexers learn the
    # attention's distribution (DeepSeek-V3.2's warm-up), before each query attends only its selected keys
    indexer_warmup: int = 0
    seed: int = field(default=1337, metadata={"reuse": "training"})
    resume: str | None = None  # a run directory or checkpoint file to continue from
    init_from: str | None = None  # start a NEW run from these weights: run dir, .pt, gpt2[-medium|...], HF folder
    stop_at_step: int | None = None  # stop (and checkpoint) early, as if interrupted; resume later
    sample_tokens: int = 200  # tokens of text printed at the end (0: none)
    # Past the trained length, at the end of a finished run: the final model read at these lengths (tokens, or
    # multiples of block_size: [1x,4x,16x]) by each protocol and past_context, as evaluate.py lengths=[...] does,
    # written beside the checkpoints (eval-final-<protocol>-<past_context>.json) for compare.py
    eval_lengths: Any = None
    eval_protocols: list[str] = field(default_factory=lambda: ["chunks"])  # chunks | sliding
    eval_past_contexts: list[str] = field(default_factory=lambda: ["ring"])  # ring | full
    run_dir: str | None = None  # where files go; train.py passes Hydra's output directory
    plan: bool = False  # print the plan (parameters, FLOPs, batch split, memory estimate) and exit
    profile: bool = False  # profile 3 steps after the warm-up: <run dir>/profile/ (time by kind, a trace)


@dataclass
class LoggerConfig:
    kind: str = "wandb"  # wandb | none (metrics.jsonl is always written)
    project: str = "headlab"
    entity: str | None = None
    group: str | None = None  # train.py passes the multirun's sweep name, if any
    name: str | None = None  # None: <attention>-<kernel>-<model>; in a sweep train.py adds the swept overrides
    mode: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    tags: list[str] = field(default_factory=list)
    # The preset that chose the model's schedule of layers (mixing=kimi_linear: kimi_linear): train.py passes the
    # command's choice; run.json, the wandb tags and the reports name a schedule's run by it and its kinds
    preset: str | None = None


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # metadata "reuse": what a change means to a reused checkpoint (training/reuse.py), for the group's fields
    # that do not say: the trainer's and the logger's settings say how a run goes, not what it computes
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"reuse": "machine"})
    logger: LoggerConfig = field(default_factory=LoggerConfig, metadata={"reuse": "machine"})

    def __post_init__(self) -> None:
        if self.optim.name == "muon":  # a split that a layer of this model cannot make
            check_split(self.optim.muon_split, self.model.layer_layouts)


ConfigStore.instance().store(name="train_schema", node=TrainConfig)
# configs/hydra/launcher/submitit_local.yaml: every job of a local parallel sweep sees every GPU.
OmegaConf.register_new_resolver("headlab_gpu_count", lambda: torch.cuda.device_count(), replace=True)


def context_share(length, parts, _node_=None) -> int:
    """configs/schedule's ``${headlab_div:${model.block_size},8}``: a window (chunk, temperature's length) as a share
    of the context, so that one schedule serves the nano model (16 keys of 128) and GPT-2 small's shape (128 of
    1024). A share that rounds down to nothing is refused here, where it is known to be a share, naming the option."""
    share = int(length) // int(parts)
    if share < 1:
        key = _node_._get_full_key(None) if _node_ is not None else "a schedule's option"
        raise ValueError(f"{key} is a schedule's share of the context, model.block_size={length} / {parts}, which "
                         f"rounds down to 0 (configs/schedule's windows and chunks are such shares); use "
                         f"model.block_size={parts} or more, or set {key} to a positive number of "
                         f"positions")  # fmt: skip
    return share


OmegaConf.register_new_resolver("headlab_div", context_share, replace=True)

LOGGER_KINDS = ("wandb", "none")
WANDB_MODES = ("auto", "online", "offline", "disabled")


def validate(cfg: TrainConfig) -> None:
    """Refuse what cannot work, naming the value and the fix (types were checked by Hydra)."""
    t, o = cfg.trainer, cfg.optim
    GPTConfig.__post_init__(cfg.model)  # again: a config built in Python may have been changed since
    check_data_config(cfg.data)
    for name in ("max_steps", "batch_size", "eval_interval", "eval_windows", "checkpoint_interval"):
        if getattr(t, name) < 1:
            raise ValueError(f"trainer.{name}={getattr(t, name)} must be at least 1")
    micro = t.micro_batch_size
    if micro not in (None, "auto") and (not isinstance(micro, int) or isinstance(micro, bool) or micro < 1):
        raise ValueError(f"trainer.micro_batch_size={micro!r} must be a positive number of sequences, null (a "
                         f"rank's whole share of the batch) or auto (the largest that the plan fits in the device's "
                         f"memory)")  # fmt: skip
    if t.seed < 0:
        raise ValueError(f"trainer.seed={t.seed} must be >= 0 (numpy seeds the data order with it)")
    if cfg.data.split_seed < 0:
        raise ValueError(f"data.split_seed={cfg.data.split_seed} must be >= 0")
    if t.resume and t.init_from:
        raise ValueError(
            "trainer.resume and trainer.init_from are both set; resume continues a run (its optimizer state and "
            "step), init_from starts a new one from its weights: choose one"
        )
    if t.stop_at_step is not None and not 0 < t.stop_at_step <= t.max_steps:
        raise ValueError(f"trainer.stop_at_step={t.stop_at_step} must be in 1..max_steps={t.max_steps}")
    if t.loss_chunk < 0:  # a whole number already (the schema's type)
        raise ValueError(f"trainer.loss_chunk={t.loss_chunk!r}: tokens per chunk of the head and loss, a whole number "
                         f">= 1 (e.g. 4096), or 0 for the whole logits at once")  # fmt: skip
    if t.indexer_warmup < 0:
        raise ValueError(f"trainer.indexer_warmup={t.indexer_warmup}: steps of dense attention while sparse "
                         f"attention's indexers learn, a whole number >= 0")  # fmt: skip
    if t.indexer_warmup and not cfg.model.in_any_layer("sparse_topk"):
        make = making_sparse(cfg.model)
        raise ValueError(f"trainer.indexer_warmup={t.indexer_warmup} warms up sparse attention's indexers, but no "
                         f"layer is sparse (model.sparse_topk=null); {f'set {make}, or ' if make else 'set '}"
                         f"trainer.indexer_warmup=0")  # fmt: skip
    if t.compile_scope not in COMPILE_SCOPES:
        raise ValueError(f"trainer.compile_scope={t.compile_scope!r}; choose one of: {', '.join(COMPILE_SCOPES)}")
    if t.compile_mode not in COMPILE_MODES:
        raise ValueError(f"trainer.compile_mode={t.compile_mode!r}; choose one of: {', '.join(COMPILE_MODES)}")
    if t.dtype not in DTYPES:
        raise ValueError(f"trainer.dtype={t.dtype!r}; choose one of: {', '.join(DTYPES)}")
    if o.lr <= 0 or not 0 <= o.min_lr <= o.lr:
        raise ValueError(f"optim.lr={o.lr}, optim.min_lr={o.min_lr}: need 0 <= min_lr <= lr and lr > 0")
    if o.warmup_steps < 0 or o.grad_clip < 0 or o.weight_decay < 0:
        raise ValueError("optim.warmup_steps, optim.grad_clip and optim.weight_decay must be >= 0")
    OptimConfig.__post_init__(o)  # again, as the model's: a config built in Python may have been changed since
    TrainConfig.__post_init__(cfg)
    check_final_lengths(cfg)
    if cfg.logger.kind not in LOGGER_KINDS:
        raise ValueError(f"logger.kind={cfg.logger.kind!r}; choose one of: {', '.join(LOGGER_KINDS)}")
    if cfg.logger.mode not in WANDB_MODES:
        raise ValueError(f"logger.mode={cfg.logger.mode!r}; choose one of: {', '.join(WANDB_MODES)}")
    if cfg.logger.preset is not None and not cfg.model.layer_pattern:
        raise ValueError(f"logger.preset={cfg.logger.preset} names a schedule of layers, but every layer of this model "
                         f"is alike (model.layer_pattern=null): set model.layer_pattern, or drop logger.preset")


def check_final_lengths(cfg: TrainConfig) -> None:
    """trainer.eval_lengths and its protocols and rules, spelled right (a learned table's model reads only the
    lengths within it: the rest are skipped, and said, when the run ends)."""
    t = cfg.trainer
    if t.eval_lengths is None:
        return
    try:
        length_spellings(t.eval_lengths)
    except ValueError as err:
        raise ValueError(f"trainer.eval_{err}") from None  # "lengths=[0]: ..." -> "trainer.eval_lengths=[0]: ..."
    for option, check in (("eval_protocols", lambda value: check_protocol(value, None)),
                          ("eval_past_contexts", check_past_context)):  # fmt: skip
        values = getattr(t, option)
        if not isinstance(values, (list, tuple)) or not values:
            example = "chunks,sliding" if option == "eval_protocols" else "ring,full"
            raise ValueError(f"trainer.{option}={values!r} must be a list of at least one (e.g. "
                             f"trainer.{option}=[{example}])")  # fmt: skip
        for value in values:
            try:
                check(value)
            except ValueError as err:
                raise ValueError(f"trainer.{option}: {err}") from None


def rank_share(trainer: TrainerConfig, world_size: int) -> int:
    """Sequences of each optimizer step that one rank computes; the batch must split evenly over the ranks."""
    if trainer.batch_size % world_size:
        raise ValueError(f"trainer.batch_size={trainer.batch_size} does not split over {world_size} ranks; choose a "
                         f"multiple of {world_size}, or run on a number of ranks that divides it")  # fmt: skip
    return trainer.batch_size // world_size


def micro_batch_for(trainer: TrainerConfig, world_size: int) -> int | str:
    """``trainer.micro_batch_size`` on ``world_size`` ranks: unset, a rank's whole share; ``auto`` stays ``auto``
    (chosen later, on the device). Refuses, before any work, a batch that does not split."""
    share = rank_share(trainer, world_size)
    micro = share if trainer.micro_batch_size is None else trainer.micro_batch_size
    if micro != "auto" and share % micro:
        divisors = [m for m in range(share, 0, -1) if share % m == 0 and m < micro]
        raise ValueError(
            f"trainer.micro_batch_size={micro} does not divide a rank's share of the batch (trainer.batch_size="
            f"{trainer.batch_size} over {world_size} rank(s): {share} sequences); set trainer.micro_batch_size to a "
            f"divisor of {share} ({', '.join(map(str, divisors[:4]))}: the same batch, more accumulation steps), or "
            f"leave it unset (null) to take the whole share"
        )
    return micro


def grad_accum_steps(trainer: TrainerConfig, world_size: int) -> int:
    """Micro-steps per optimizer step; the batch must split evenly over ranks and micro-batches.

    With ``micro_batch_size=auto`` (chosen later, on the device) it checks the split over ranks and returns 0.
    """
    micro = micro_batch_for(trainer, world_size)
    return 0 if micro == "auto" else rank_share(trainer, world_size) // micro

"""Validation loss and bits per byte of any model on any data: ``python evaluate.py source=... [data=...]``.

    python evaluate.py source=runs/2026-11-21/10-00-00_fused_qkv-sdpa          # the run's own data
    python evaluate.py source=gpt2 data=tinyshakespeare                         # pretrained GPT-2

The windows are training's: ``windows`` windows of ``block_size`` tokens spread
evenly over the validation split (for a run, its ``trainer.eval_windows`` and
micro-batch), so a finished run's last ``val/loss`` is reproduced. The text comes
from ``data=`` (default pystdlib), tokenized with the model's own tokenizer.
Prints ``val/loss`` and ``val/bpb`` and writes them as JSON to ``out`` (default: beside the weights).

Past the trained length (a model without a position table: rope, alibi, none):

    python evaluate.py source=<run> lengths=[1x,2x,4x,16x] protocol=chunks past_context=full

``lengths`` are token counts or multiples of ``block_size``; ``protocol`` is ``chunks`` (independent chunks,
ALiBi's) or ``sliding`` (windows ``stride`` apart, YaRN's perplexity); ``past_context`` is ``ring`` (each
position sees its last ``block_size`` keys, as sample.py decodes) or ``full`` (every earlier key). The loss at
each length, and at each position of a sequence, go to the JSON, a table, and a plot beside it.

Retrieval at those lengths (data/retrieval.py: a pass key hidden in filler text, multi-query associative
recall), scored by the model's top choice at each depth of the fact:

    python evaluate.py source=<run> lengths=[1x,4x,16x] retrieval=[passkey,mqar] depths=[0,0.5,1]

Its accuracy goes to the JSON (``retrieval``), a table, and a heatmap (``<out>-retrieval.png``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from analysis.lengths import plot_run_by_position
from analysis.retrieval import plot_retrieval, retrieval_table
from cli import (
    check_at_least,
    check_attention_and_kernel,
    check_choice,
    check_overrides,
    take_layout_options,
    user_errors,
    with_layout_options,
)
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from data.retrieval import check_depth, check_retrieval, check_task
from model import load_model
from model.checkpoint import BEST, LAST
from model.context import check_past_context, check_reaches, with_rope_scaling
from model.device import resolve_device, resolve_dtype
from training.config import TrainerConfig
from training.evaluate import (
    Evaluator,
    check_protocol,
    length_rows,
    length_spellings,
    resolve_lengths,
    scaling_part,
)
from training.retrieval import retrieval_rows


@dataclass
class EvaluateConfig:
    source: str = MISSING  # a run directory, a checkpoint file, gpt2[-medium|-large|-xl], or an HF folder
    checkpoint: str = LAST  # which checkpoint of a run directory: last.pt | best.pt
    data: DataConfig = field(default_factory=DataConfig)  # the text; its tokenizer is the model's
    windows: int | None = None  # None: the run's trainer.eval_windows (or training's default)
    batch_size: int | None = None  # None: the run's trainer.micro_batch_size (or training's default)
    attention: str | None = None  # evaluate in another layout (the same function)
    kernel: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    out: str | None = None  # None: beside the weights (run dir, .pt's folder, HF folder), else ./eval-out/
    lengths: Any = None  # evaluate at these lengths too: tokens (512) or multiples of block_size (4x), a list
    protocol: str = "chunks"  # chunks (independent, ALiBi's) | sliding (windows `stride` apart, YaRN's)
    stride: int | None = None  # sliding: tokens between windows (None: half the length)
    past_context: str = "ring"  # ring: each position sees its last block_size keys | full: every earlier key
    rope_scaling: str | None = None  # read a rotary model scaled: pi | ntk | yarn (None: as it was trained)
    rope_factor: float | None = None  # the scaling's factor s (None: the longest length over block_size)
    retrieval: Any = None  # at those lengths too: passkey | mqar, or a list (data/retrieval.py)
    depths: Any = field(default_factory=lambda: [0, 0.25, 0.5, 0.75, 1])  # where the fact sits: 0 start, 1 end
    examples: int = 20  # retrieval: sequences per task, length and depth
    seed: int = 0  # retrieval: which sequences (the same seed, the same ones)


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
USAGE = "python evaluate.py source=<run dir | checkpoint.pt | gpt2 | hf folder> [data=<source>] [key=value ...]"


def check(cfg: EvaluateConfig) -> None:
    """Every option that can be checked before the model is loaded; errors name the option as typed."""
    if cfg.windows is not None:
        check_at_least("windows", cfg.windows, 1)
    if cfg.batch_size is not None:
        check_at_least("batch_size", cfg.batch_size, 1)
    check_choice("checkpoint", cfg.checkpoint, (BEST, LAST))
    check_attention_and_kernel(cfg.attention, cfg.kernel)
    resolve_dtype(cfg.dtype, resolve_device(cfg.device, option="device"), option="dtype")
    if cfg.lengths is not None:
        length_spellings(cfg.lengths)
    check_protocol(cfg.protocol, cfg.stride)
    check_past_context(cfg.past_context)
    if cfg.rope_factor is not None and cfg.rope_scaling is None:
        raise ValueError(f"rope_factor={cfg.rope_factor} scales nothing without rope_scaling=pi|ntk|yarn")
    if cfg.lengths is None and (cfg.protocol != "chunks" or cfg.stride is not None or cfg.past_context != "ring"):
        raise ValueError("protocol, stride and past_context apply to lengths=[...]; add e.g. lengths=[1x,4x,16x]")
    retrieval_tasks(cfg)
    retrieval_depths(cfg)
    check_at_least("examples", cfg.examples, 1)
    if cfg.retrieval is not None and cfg.lengths is None:
        raise ValueError(f"retrieval={cfg.retrieval} is read at lengths=[...]; add e.g. lengths=[1x,4x,16x]")
    if cfg.out is not None and Path(cfg.out).is_dir():
        raise ValueError(f"out={cfg.out!r} is a directory; give a file name for the JSON (e.g. out=eval.json)")


def checked_values(option: str, value: Any, check) -> list:
    """``value`` as a list (one value, or a list as given), each checked by ``check``; a refusal names the
    option as typed."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    for one in values:
        try:
            check(one)
        except ValueError as err:
            raise ValueError(f"{option}={value}: {err}") from None
    return values


def retrieval_tasks(cfg: EvaluateConfig) -> list[str]:
    """``retrieval`` as a list of tasks (none when unset)."""
    return [] if cfg.retrieval is None else checked_values("retrieval", cfg.retrieval, check_task)


def retrieval_depths(cfg: EvaluateConfig) -> list[float]:
    """``depths`` as a list, each checked (0: the sequence's start, 1: just before the question)."""
    if isinstance(cfg.depths, (list, tuple)) and not cfg.depths:
        raise ValueError("depths=[] names no depth; give numbers from 0 to 1, e.g. depths=[0,0.5,1]")
    return checked_values("depths", cfg.depths, check_depth)


def evaluation_batch(trained: dict, defaults: TrainerConfig) -> int:
    """The run's micro-batch, as its evaluations used; where that was null (a rank's whole share) or auto
    (chosen on the device), its batch_size: the windows are the same, only how many go at once differs."""
    micro = trained.get("micro_batch_size", defaults.micro_batch_size)
    if isinstance(micro, int) and not isinstance(micro, bool):
        return micro
    return trained.get("batch_size", defaults.batch_size)


FALLBACK_DIR = Path("eval-out")  # for a hub name, or weights in a folder this user cannot write to


def default_out(cfg: EvaluateConfig, checkpoint: Path | None) -> Path:
    """Beside the weights: ``eval-<checkpoint>-<data>.json`` in a run directory or beside a .pt file,
    ``eval-<data>.json`` in a Hugging Face folder; ``./eval-out/eval-<name>-<data>.json`` for a hub name or
    where that folder is not writable (a shared model folder)."""
    source = Path(cfg.source).expanduser()
    if checkpoint is not None:
        folder, name = checkpoint.parent, f"eval-{checkpoint.stem}-{cfg.data.name}.json"
    elif source.is_dir():
        folder, name = source, f"eval-{cfg.data.name}.json"
    else:
        folder = None
    if folder is not None and os.access(folder, os.W_OK):
        return folder / name
    label = source.stem if source.suffix == ".pt" else source.name
    if checkpoint is not None and source.is_dir():  # a run directory: which of its checkpoints
        label += f"-{checkpoint.stem}"
    if folder is not None:
        print(f"[evaluate] {folder} is not writable: the result goes to {FALLBACK_DIR}/ (out= chooses)",
              file=sys.stderr)  # fmt: skip
    return FALLBACK_DIR / f"eval-{label}-{cfg.data.name}.json"


def run(cfg: EvaluateConfig) -> dict:
    check(cfg)
    defaults = TrainerConfig()
    loaded = load_model(cfg.source, cfg.attention, cfg.kernel, checkpoint=cfg.checkpoint)
    trained = (loaded.checkpoint.train_config or {}).get("trainer", {}) if loaded.checkpoint else {}
    windows = cfg.windows or trained.get("eval_windows", defaults.eval_windows)
    batch = cfg.batch_size or evaluation_batch(trained, defaults)
    for name, value in (("windows", windows), ("batch_size", batch)):
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    device = resolve_device(cfg.device, option="device")
    dtype = resolve_dtype(cfg.dtype, device, option="dtype")
    model = loaded.model.to(device)
    block = model.config.block_size  # rotary scaling keeps it
    lengths = resolve_lengths(cfg.lengths, block) if cfg.lengths is not None else []
    if cfg.rope_scaling is not None:  # the same weights, rotary scaled: refused as the model option would be
        factor = cfg.rope_factor or (max(1.0, max(lengths) / block) if lengths else None)
        if factor is None:
            raise ValueError(f"rope_scaling={cfg.rope_scaling} needs rope_factor=<s> (4: read 4x the trained "
                             f"length), or lengths=[...] to take it from the longest")  # fmt: skip
        try:
            model = with_rope_scaling(model, cfg.rope_scaling, factor)
        except ValueError as err:
            raise ValueError(f"rope_scaling={cfg.rope_scaling} rope_factor={factor:g}: {err}") from None
    data = PreparedData(prepare(replace(cfg.data, tokenizer=loaded.tokenizer.name)))
    data.check_fits(block, model.config.vocab_size)
    tasks = retrieval_tasks(cfg)
    for length in lengths:  # before any work: a learned table, or a split too short
        try:
            check_reaches(model.config, length)
        except ValueError as err:
            raise ValueError(f"lengths={cfg.lengths}: {err}") from None
        check_retrieval(tasks, loaded.tokenizer.encode, length, option=f"lengths={cfg.lengths}")
        if length + 1 > len(data.tokens["val"]):
            raise ValueError(f"lengths={cfg.lengths}: {length} tokens is more than the validation split holds "
                             f"({len(data.tokens['val']):,} tokens of data={cfg.data.name}); evaluate shorter "
                             f"lengths")  # fmt: skip
    evaluator = Evaluator(data.tokens["val"], block, windows, batch, data.bytes_per_token("val"), device, dtype)
    metrics = evaluator(model)
    result = {**metrics, "source": cfg.source, "checkpoint": str(loaded.path) if loaded.path else None,
              "step": loaded.step, "data": cfg.data.name, "data_dir": str(data.folder), "windows": windows,
              "block_size": block, "tokenizer": loaded.tokenizer.name, "rope_scaling": model.config.rope_scaling,
              "rope_factor": model.config.rope_factor}  # fmt: skip
    if lengths:
        result["lengths"] = length_rows(model, data.tokens["val"], lengths, cfg.protocol, cfg.past_context, windows,
                                        cfg.stride, batch * block, data.bytes_per_token("val"), device, dtype,
                                        progress=True)  # fmt: skip
    if cfg.retrieval is not None:
        result["retrieval"] = retrieval_rows(model, loaded.tokenizer.encode, tasks, lengths,
                                             retrieval_depths(cfg), cfg.past_context, cfg.examples, cfg.seed,
                                             batch * block, device, dtype, progress=True)  # fmt: skip
    out = Path(cfg.out) if cfg.out else default_out(cfg, loaded.path)
    out.parent.mkdir(parents=True, exist_ok=True)  # out=results/eval.json: the folder too
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"val/loss {metrics['val/loss']:.4f}  val/bpb {metrics['val/bpb']:.4f}  ({loaded.name}, {windows} windows of "
          f"{block} tokens of data={cfg.data.name}); written to {out}")  # fmt: skip
    if lengths:
        print(length_table(result["lengths"], block))
        picture = out.with_suffix(".png")
        scaled = f", rope_scaling={scaling_part(model.config)}" if cfg.rope_scaling else ""
        plot_run_by_position(result["lengths"], block, picture, f"{loaded.name}: loss by position "
                             f"({cfg.protocol}, past_context={cfg.past_context}{scaled})")  # fmt: skip
        print(f"loss by position: {picture}")
    if cfg.retrieval is not None:
        print(retrieval_table(result["retrieval"], block))
        picture = out.with_name(f"{out.stem}-retrieval.png")
        title = (f"{loaded.name}: retrieval by depth and length (past_context={cfg.past_context}, {cfg.examples} "
                 f"sequences per cell, seed {cfg.seed})")  # fmt: skip
        plot_retrieval(result["retrieval"], block, picture, title)
        print(f"retrieval heatmap: {picture}")
    return result


def length_table(rows: list[dict], block: int) -> str:
    """The loss at each length, then the mean loss over each block_size-long span of positions: where a model
    stops generalising, the spans past its trained length climb."""
    spans = max(-(-row["length"] // block) for row in rows)
    head = ["length", "x block_size", "protocol", "past context", "rope scaling", "loss", "bpb", "tokens scored"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        lines.append(f"| {row['length']} | {row['multiple']:g}x | {row['protocol']} | {row['past_context']} | "
                     f"{row['rope_scaling'] or 'none'} | {row['loss']:.4f} | {row['bpb']:.4f} | "
                     f"{row['tokens']:,} |")  # fmt: skip
    lines += ["", f"loss by position, the mean over each span of {block} positions (positions count from 0):", ""]
    names = [f"{i * block}-{(i + 1) * block - 1}" for i in range(spans)]
    lines += ["| length | " + " | ".join(names) + " |", "|" + " --- |" * (spans + 1)]
    for row in rows:
        cells = []
        for i in range(spans):
            part = [v for v in row["loss_by_position"][i * block : (i + 1) * block] if v == v]  # no NaN
            cells.append(f"{sum(part) / len(part):.3f}" if part else "")
        lines.append(f"| {row['length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    with user_errors(USAGE):
        run(with_layout_options(OmegaConf.to_object(cfg)))


if __name__ == "__main__":
    take_layout_options()
    check_overrides("evaluate", "python evaluate.py")
    main()

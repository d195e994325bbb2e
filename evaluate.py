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

evaluate.py writes only its own files: a JSON it wrote says so (``"written_by": "evaluate.py"``) and holds the
question it answers (``question``: the weights, data and options that decide the result). A result replaces an
earlier one only where that is evaluate.py's answer to the same question; another question gets the next free
name (``eval-last-pystdlib-2.json``, said on stderr), and ``out=`` naming a file evaluate.py did not write, or
its answer to another question, is refused before any work. Every file is written under a temporary name and
renamed into place: a full disk leaves the earlier file as it was.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import itertools
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace
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
from common.run_files import write_json
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from data.retrieval import TASKS, check_depth, check_task, usable_lengths
from model import load_model
from model.checkpoints.checkpoint import BEST, LAST
from model.decoding.context import check_past_context, check_reaches, with_rope_scaling
from model.device import available_memory, resolve_device, resolve_dtype
from training.config import TrainerConfig
from training.evaluate import Evaluator, check_memory, length_rows, most_sequences, scaling_part
from training.lengths import check_protocol, length_spellings, resolve_lengths
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
    if cfg.out is not None:
        check_out_name(Path(cfg.out).expanduser(), cfg.out)


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
    """``retrieval`` as a list of tasks (none when unset; an empty list is refused: it asks for nothing)."""
    if isinstance(cfg.retrieval, (list, tuple)) and not cfg.retrieval:
        raise ValueError(f"retrieval=[] names no task; give {' or '.join(TASKS)} or both "
                         f"(retrieval=[{','.join(TASKS)}]), or leave retrieval out")  # fmt: skip
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


def name_part(text: str) -> str:
    """``text`` as part of a file name: one component, never a path (``data.name=../../x`` is ``x``)."""
    return re.sub(r"[^\w.+=-]+", "_", text).strip("._") or "data"


def default_out(cfg: EvaluateConfig, checkpoint: Path | None) -> Path:
    """Beside the weights: ``eval-<checkpoint>-<data>.json`` in a run directory or beside a .pt file,
    ``eval-<data>.json`` in a Hugging Face folder; ``./eval-out/eval-<name>-<data>.json`` for a hub name or
    where that folder is not writable (a shared model folder). The first choice: ``result_path`` moves to the next
    name where this one holds another question."""
    source = Path(cfg.source).expanduser()
    data = name_part(cfg.data.name)
    if checkpoint is not None:
        folder, name = checkpoint.parent, f"eval-{name_part(checkpoint.stem)}-{data}.json"
    elif source.is_dir():
        folder, name = source, f"eval-{data}.json"
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
    return FALLBACK_DIR / f"eval-{name_part(label)}-{data}.json"


# ------------------------------------------------------------------ the files evaluate.py owns

WRITTEN_BY = "evaluate.py"  # every JSON evaluate.py writes says so: the only files it ever replaces


def check_out_name(out: Path, typed: str) -> None:
    """``out=`` before any work: a .json name (its plots go beside it) that is new or one of evaluate.py's
    results; whether that result answers the same question is checked once the question is known."""
    if out.is_dir():
        raise ValueError(f"out={typed!r} is a directory; give a file name for the JSON (e.g. out={out / 'eval.json'})")
    if out.suffix != ".json":
        raise ValueError(f"out={typed} is not a .json name: evaluate.py writes its result as JSON and its plots "
                         f"beside it; give e.g. out={free_name(out.with_suffix('.json'))}")  # fmt: skip
    if out.exists() and own_result(out) is None:
        raise ValueError(f"out={typed} exists and evaluate.py did not write it (a checkpoint, a run's record or "
                         f"another file): it is kept; give a new name, e.g. out={free_name(out)}")  # fmt: skip


def own_result(path: Path) -> dict | None:
    """An earlier result evaluate.py wrote at ``path`` (it names itself and its question), or None."""
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, not text, not JSON
        return None
    if isinstance(held, dict) and held.get("written_by") == WRITTEN_BY and isinstance(held.get("question"), dict):
        return held
    return None


def pictures(out: Path, lengths: bool, retrieval: bool) -> list[Path]:
    """The plots a result at ``out`` draws beside it."""
    return [*([out.with_suffix(".png")] if lengths else []),
            *([out.with_name(f"{out.stem}-retrieval.png")] if retrieval else [])]  # fmt: skip


def why_not(out: Path, question: dict, plots: list[Path]) -> str | None:
    """Why a result to ``question`` may not go to ``out`` (and ``plots`` beside it), said of ``out``, or None
    where it may: the name is new, or holds evaluate.py's answer to the same question (its plots with it)."""
    if out.exists():
        held = own_result(out)
        if held is None:
            return "exists and evaluate.py did not write it"
        if held["question"] != question:
            return f"holds evaluate.py's result of another question ({differences(held['question'], question)})"
        return None
    taken = next((plot for plot in plots if plot.exists()), None)
    return f"is new, but {taken} exists and evaluate.py did not write it (this result's plot)" if taken else None


def differences(held: dict, asked: dict, most: int = 3) -> str:
    """How two questions differ, in words: ``lengths [32, 64] there, [32, 128] here``."""
    keys = [key for key in dict.fromkeys([*held, *asked]) if held.get(key) != asked.get(key)]
    parts = [f"{key} {held.get(key, 'unset')} there, {asked.get(key, 'unset')} here" for key in keys[:most]]
    return "; ".join(parts) + (f"; and {len(keys) - most} more" if len(keys) > most else "")


def numbered(base: Path):
    """``base``, then ``<stem>-2.json``, ``<stem>-3.json``, ... (a numbered ``base`` counts on from its stem's)."""
    yield base
    stem = re.sub(r"-\d+$", "", base.stem)
    for i in itertools.count(2):
        yield base.with_name(f"{stem}-{i}{base.suffix}")


def free_name(base: Path, plots_of=lambda path: []) -> Path:
    """The first of ``numbered(base)`` that nothing holds (nor its plots: ``plots_of(path)``)."""
    return next(path for path in numbered(base) if not path.exists() and not any(p.exists() for p in plots_of(path)))


def result_path(cfg: EvaluateConfig, loaded, question: dict, lengths: bool, retrieval: bool) -> Path:
    """Where this question's result goes: ``out=`` (refused where it holds what is not this question's), or
    the first of the default name and its numbered siblings that is new or this question's (a move said on
    stderr)."""
    def plots_of(path: Path) -> list[Path]:
        return pictures(path, lengths, retrieval)

    if cfg.out is not None:
        out = Path(cfg.out).expanduser()
        reason = why_not(out, question, plots_of(out))
        if reason is not None:
            raise ValueError(f"out={cfg.out} {reason}; it is kept: give another name, e.g. out="
                             f"{free_name(out, plots_of)}, or remove it first")  # fmt: skip
        return out
    base = default_out(cfg, loaded.path)
    moved = why_not(base, question, plots_of(base))
    if moved is None:
        return base
    out = next(path for path in numbered(base) if why_not(path, question, plots_of(path)) is None)
    print(f"[evaluate] {base} {moved}: this result goes to {out}", file=sys.stderr)
    return out


def question_of(cfg: EvaluateConfig, loaded, config, windows: int, dtype, lengths: list[int], tasks: list[str],
                depths: list[float]) -> dict:  # fmt: skip
    """What decides the result, as JSON holds it: the weights (the file read, or the hub name), the data, the
    windows, layout, kernel and dtype, and what was asked past the trained length. Not the device or the
    batch (they change how, not what), nor the step (a run that went on gives the same question a new answer)."""
    source = loaded.path or Path(cfg.source).expanduser()
    asked = {
        "source": str(source.resolve()) if source.exists() else cfg.source,
        "data": {k: v for k, v in asdict(cfg.data).items() if k not in ("tokenizer", "num_proc", "cache_dir")},
        "windows": windows, "attention": config.attention, "kernel": config.kernel,
        "dtype": str(dtype).removeprefix("torch."),
        "rope_scaling": config.rope_scaling, "rope_factor": config.rope_factor,
    }  # fmt: skip
    if lengths:
        asked.update(lengths=lengths, protocol=cfg.protocol, stride=cfg.stride, past_context=cfg.past_context)
    if tasks:
        asked.update(retrieval=tasks, depths=depths, examples=cfg.examples, seed=cfg.seed)
    return json.loads(json.dumps(asked))  # as it reads back from the file: lists, not tuples


def write_result(out: Path, result: dict, printed: str) -> None:
    """The JSON, written under a temporary name and renamed into place. Where that fails (a full disk), the
    earlier file is as it was, the result is printed whole (nothing computed is lost), and one line says why."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # out=results/eval.json: the folder too
        write_json(out, result)
    except OSError as err:
        print(printed)
        print(json.dumps(result))
        kept = f"the earlier {out.name} is as it was" if out.exists() else f"nothing was written at {out}"
        raise OSError(f"could not write {out} ({err.strerror or err}); {kept}, and the result is printed above "
                      f"as JSON; free some space, or give out=<a file on another disk or a folder you can write "
                      f"to>") from None  # fmt: skip


def draw(plot, picture: Path, out: Path) -> None:
    """One plot beside the result: a failure to save it (a full disk) is one line, the JSON already written."""
    try:
        plot(picture)
    except OSError as err:
        raise OSError(f"could not write {picture} ({err.strerror or err}); the result is in {out}; free some "
                      f"space and evaluate again to draw it") from None  # fmt: skip


def readings(cfg: EvaluateConfig, block: int, windows: int, batch: int, lengths: list[int],
             usable: dict[str, list[int]]) -> list[tuple[str, int, int]]:  # fmt: skip
    """What the evaluation reads, for its memory plan: (the option that asks for it, tokens per sequence, the most
    sequences read at once): the validation windows, then each length (its chunks or windows, and its retrieval
    examples)."""
    span = windows * max(lengths, default=1)  # length_rows: the same stretch at every length
    rows = [(f"batch_size={batch}", block, windows)]
    for n in lengths:
        examples = cfg.examples if any(n in usable_at for usable_at in usable.values()) else 0
        rows.append((f"lengths={cfg.lengths}", n, max(most_sequences(n, cfg.protocol, span, cfg.stride), examples)))
    return rows


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
        if factor == 1:  # every scaling by 1 is rotary as it is
            why = ("rope_factor=1" if cfg.rope_factor is not None
                   else f"the longest length read, {max(lengths)}, is the trained one: a factor of 1")  # fmt: skip
            raise ValueError(f"rope_scaling={cfg.rope_scaling} scales nothing where {why}; read past the trained "
                             f"length (lengths=[1x,4x]), or set rope_factor=<s above 1>, or leave rope_scaling "
                             f"unset")  # fmt: skip
        try:
            model = with_rope_scaling(model, cfg.rope_scaling, factor)
        except ValueError as err:
            raise ValueError(f"rope_scaling={cfg.rope_scaling} rope_factor={factor:g}: {err}") from None
    tasks = retrieval_tasks(cfg)
    for length in lengths:  # before any work: a learned table
        try:
            check_reaches(model.config, length)
        except ValueError as err:
            raise ValueError(f"lengths={cfg.lengths}: {err}") from None
    usable, skipped = usable_lengths(tasks, loaded.tokenizer.encode, lengths, f"lengths={cfg.lengths}") \
        if tasks else ({}, None)  # fmt: skip
    check_memory(model.config, readings(cfg, block, windows, batch, lengths, usable), batch * block, cfg.past_context,
                 available_memory(device), device, dtype)  # fmt: skip
    question = question_of(cfg, loaded, model.config, windows, dtype, lengths, tasks, retrieval_depths(cfg))
    out = result_path(cfg, loaded, question, bool(lengths), bool(tasks))
    data = PreparedData(prepare(replace(cfg.data, tokenizer=loaded.tokenizer.name)))
    data.check_fits(block, model.config.vocab_size)
    for length in lengths:  # before any work: a split too short
        if length + 1 > len(data.tokens["val"]):
            raise ValueError(f"lengths={cfg.lengths}: {length} tokens is more than the validation split holds "
                             f"({len(data.tokens['val']):,} tokens of data={cfg.data.name}); evaluate shorter "
                             f"lengths")  # fmt: skip
    if skipped:
        print(skipped)
    start_up_over()  # the evaluation begins
    evaluator = Evaluator(data.tokens["val"], block, windows, batch, data.bytes_per_token("val"), device, dtype)
    metrics = evaluator(model)
    result = {**metrics, "source": cfg.source, "checkpoint": str(loaded.path) if loaded.path else None,
              "step": loaded.step, "data": cfg.data.name, "data_dir": str(data.folder), "windows": windows,
              "block_size": block, "tokenizer": loaded.tokenizer.name, "rope_scaling": model.config.rope_scaling,
              "rope_factor": model.config.rope_factor, "written_by": WRITTEN_BY, "question": question}  # fmt: skip
    if lengths:
        result["lengths"] = length_rows(model, data.tokens["val"], lengths, cfg.protocol, cfg.past_context, windows,
                                        cfg.stride, batch * block, data.bytes_per_token("val"), device, dtype,
                                        progress=True)  # fmt: skip
    if tasks:
        result["retrieval"] = retrieval_rows(model, loaded.tokenizer.encode, tasks, lengths,
                                             retrieval_depths(cfg), cfg.past_context, cfg.examples, cfg.seed,
                                             batch * block, device, dtype, progress=True, usable=usable)  # fmt: skip
        result["retrieval_skipped"] = skipped
    summary = (f"val/loss {metrics['val/loss']:.4f}  val/bpb {metrics['val/bpb']:.4f}  ({loaded.name}, {windows} "
               f"windows of {block} tokens spread over the validation split of data={cfg.data.name}, as training "
               f"measures val/loss)")  # fmt: skip
    tables = [*([by_length_note(result["lengths"], block, windows), length_table(result["lengths"], block)]
                if lengths else []),
              *([retrieval_table(result["retrieval"], block)] if tasks else []),
              *([skipped] if skipped else [])]  # fmt: skip
    write_result(out, result, "\n".join([summary, *tables]))
    print(f"{summary}; written to {out}")
    if lengths:
        print(by_length_note(result["lengths"], block, windows))
        print(length_table(result["lengths"], block))
        picture = out.with_suffix(".png")
        scaled = f", rope_scaling={scaling_part(model.config)}" if cfg.rope_scaling else ""
        title = f"{loaded.name}: loss by position ({cfg.protocol}, past_context={cfg.past_context}{scaled})"
        draw(lambda path: plot_run_by_position(result["lengths"], block, path, title), picture, out)
        print(f"loss by position: {picture}")
    if tasks:
        print(retrieval_table(result["retrieval"], block))
        if skipped:
            print(skipped)
        picture = out.with_name(f"{out.stem}-retrieval.png")
        title = (f"{loaded.name}: retrieval by depth and length (past_context={cfg.past_context}, {cfg.examples} "
                 f"sequences per cell, seed {cfg.seed})")  # fmt: skip
        draw(lambda path: plot_retrieval(result["retrieval"], block, path, title), picture, out)
        print(f"retrieval heatmap: {picture}")
    return result


def by_length_note(rows: list[dict], block: int, windows: int) -> str:
    """Which text the length table reads: not val/loss's windows, so its row at the trained length is another loss."""
    longest = max(row["length"] for row in rows)
    trained = (f"; its loss at {block} tokens (1x) is over that stretch, not over val/loss's windows above"
               if any(row["length"] == block for row in rows) else "")  # fmt: skip
    return (f"by length: every length reads the same first {windows * longest:,} tokens of the validation split "
            f"({windows} windows x the longest length, {longest}){trained}:")  # fmt: skip


def length_table(rows: list[dict], block: int) -> str:
    """The loss at each length, then the mean loss over each block_size-long span of positions: where a model
    stops generalising, the spans past its trained length climb."""
    spans = max(-(-row["length"] // block) for row in rows)
    head = ["length", "x block_size", "protocol", "past context", "rope scaling", "loss",
            "± s.e. (over its sequences: another stretch of text)", "bpb", "tokens scored"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        error = f"±{row['loss_se']:.4f}" if row.get("loss_se") is not None else "- (one sequence)"
        lines.append(f"| {row['length']} | {row['multiple']:g}x | {row['protocol']} | {row['past_context']} | "
                     f"{row['rope_scaling'] or 'none'} | {row['loss']:.4f} | {error} | {row['bpb']:.4f} | "
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

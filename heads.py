"""Inside the committee: what each attention head of a checkpoint does, and which heads matter.

    python heads.py source=runs/2026-11-21/10-00-00_fused_qkv-sdpa
    python heads.py source=runs/... prompt="for i in range(10):" layer=1 head=3 prune=true
    python heads.py source=gpt2 data=tinyshakespeare       # pretrained GPT-2, through the same loader

The validation text comes from the ``data`` option (as in train.py; default
pystdlib), tokenized with the model's own tokenizer: pass the data the model
was trained on. Writes to ``out`` (default: ``<run dir>/heads-<checkpoint>/``
for a run, ``heads-<name>/`` otherwise):
- maps.png: attention maps, layers x heads, for the prompt (or the start of the validation text);
- head_L{layer}_H{head}.png: one head's map, larger, its tokens on both axes and the text in its title;
- stats.md / stats.csv / stats.png: per-head entropy, mean attention distance, previous-token
  and first-token (sink) scores, over validation windows;
- ablation.md / ablation.csv / ablation.png: the validation-loss increase when each head alone is
  removed; with prune=true also pruning.csv / pruning.png, removing heads greedily.
A study in a folder that holds an earlier one's results removes those it did not rewrite (another head's map, a
pruning curve), once its own are written, and says so.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from analysis.head_plots import (
    GRID_LABELED_TOKENS,
    one_line,
    plot_head_heatmaps,
    plot_map_grid,
    plot_pruning,
    plot_single_map,
    token_label,
)
from analysis.heads import (
    GATE,
    SINK,
    STAT_UNITS,
    ablation,
    attention_maps,
    check_head,
    gate_means,
    gated,
    greedy_pruning,
    head_statistics,
    stats_of,
)
from analysis.tables import write_table
from cli import (
    check_at_least,
    check_attention_and_kernel,
    check_choice,
    check_overrides,
    refuse_renamed_options,
    take_layout_options,
    take_text_options,
    user_errors,
    with_layout_options,
)
from data.config import DataConfig
from data.loader import PreparedData, validation_starts, windows
from data.prepare import prepare
from model import load_model
from model.checkpoints.checkpoint import BEST, LAST
from model.config import attention_label
from model.device import resolve_device


@dataclass
class HeadsConfig:
    source: str = MISSING  # a run directory, a checkpoint file, gpt2[-medium|-large|-xl], or an HF folder
    checkpoint: str = BEST  # which checkpoint of a run directory: best.pt | last.pt
    data: DataConfig = field(default_factory=DataConfig)  # the validation text; its tokenizer is the model's
    prompt: str | None = None  # text for the attention maps; unset: the start of the validation text
    map_tokens: int = 24  # without a prompt: how many validation tokens the maps show
    windows: int = 16  # validation windows (block_size tokens each) for statistics and ablation
    layer: int = 0  # the head shown large
    head: int = 0
    prune: bool = False  # also remove heads greedily, least important first (n_heads^2 / 2 evaluations)
    attention: str | None = None  # analyse the weights in another QKV layout (the results are the same)
    kernel: str | None = None
    device: str = "auto"
    out: str | None = None  # unset: <run dir>/heads-<checkpoint> for runs, heads-<name> otherwise
    wandb: bool = False  # also log the maps and tables as a wandb run (job_type=heads), offline without a key


ConfigStore.instance().store(name="heads_schema", node=HeadsConfig)
USAGE = "python heads.py source=<run dir | checkpoint.pt | gpt2 | hf folder> [data=<source>] [key=value ...]"


def validation_windows(data_cfg: DataConfig, n: int, block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows spread evenly over the validation split (training's ``validation_starts``)."""
    data = PreparedData(prepare(data_cfg))
    val = data.tokens["val"]
    data.check_fits(block_size, vocab_size=data.vocab_size)
    return windows(val, validation_starts(len(val), block_size, n), block_size, device)


def map_text_caption(cfg: HeadsConfig, ids: list[int], tokenizer, block_size: int) -> str:
    """Which text the maps show, for their titles: the prompt (its last block_size tokens when longer) or the
    start of the validation text, and the text itself on one line."""
    if cfg.prompt is None:
        where = f"the first {len(ids)} validation tokens of data={cfg.data.name}"
    elif len(tokenizer.encode(cfg.prompt)) > block_size:
        where = f"the prompt's last {len(ids)} tokens (block_size={block_size})"
    else:
        where = f"the prompt ({len(ids)} tokens)"
    return f"{where}: {one_line(tokenizer.decode_bytes(ids).decode('utf-8', errors='replace'))}"


def sink_caption(maps: torch.Tensor) -> str:
    """For a model with sinks: a row of a map sums to less than 1; the mean weight the sinks took."""
    return f"\n(with sinks: rows sum to < 1; mean weight on the sink {(1 - maps.sum(-1)).mean():.3f})"


def base_noise(removed, windows: int) -> str:
    """`` ±0.0123 (its standard error over the 16 windows)``: how far another stretch of text might move it."""
    if removed.base_error != removed.base_error:  # one window: no spread to measure
        return ""
    return f" ±{removed.base_error:.4f} (its standard error over the {windows} windows)"


def other_windows(loaded, windows: int) -> str:
    """Where the run's own val/loss averaged other windows: why the two losses differ, and how to read the same."""
    trained = ((loaded.checkpoint.train_config or {}).get("trainer", {}) if loaded.checkpoint else {}).get(
        "eval_windows")
    if trained is None or trained == windows:
        return ""
    return (f"; not the run's val/loss, which averaged trainer.eval_windows={trained} windows (windows={trained} "
            f"on the data it trained on reads the same ones)")


# What heads.py writes into its folder: a later study there replaces them all, so none is left from another one
OWN_RESULTS = ("maps.png", "head_L*_H*.png", *(f"{table}.{kind}" for table in ("stats", "ablation", "pruning")
                                                 for kind in ("csv", "md", "png")))  # fmt: skip


def remove_earlier_results(out: Path, cfg: HeadsConfig) -> list[str]:
    """Remove the files of an earlier study in ``out`` that this one did not write (another head's map, a pruning
    curve where prune=false), once this one's are written: they would read as its results (and go to wandb with
    them). Returns their names."""
    written = {f"head_L{cfg.layer}_H{cfg.head}.png", "maps.png",
               *(f"{table}.{kind}" for table in ("stats", "ablation", *(["pruning"] if cfg.prune else []))
                 for kind in ("csv", "md", "png"))}  # fmt: skip
    stale = sorted({p for pattern in OWN_RESULTS for p in out.glob(pattern) if p.name not in written})
    for path in stale:
        path.unlink(missing_ok=True)
    return [p.name for p in stale]


def default_out(cfg: HeadsConfig, path: Path | None) -> Path:
    if path is None:  # a pretrained model
        return Path(f"heads-{Path(cfg.source).name}")
    return path.parent / f"heads-{path.stem}"


MAX_WINDOWS = 4096  # each window is a forward pass per head for the ablation: more would run for hours


def check(cfg: HeadsConfig) -> None:
    """Every option that can be checked before the model is loaded; errors name the option as typed."""
    if cfg.prompt is not None and not cfg.prompt.strip():
        raise ValueError("prompt is empty; give some text, or leave prompt unset to use validation text")
    check_at_least("windows", cfg.windows, 1)
    if cfg.windows > MAX_WINDOWS:
        raise ValueError(f"windows={cfg.windows} is more than {MAX_WINDOWS}; statistics settle long before (try 64)")
    check_at_least("map_tokens", cfg.map_tokens, 1)
    check_at_least("layer", cfg.layer, 0)
    check_at_least("head", cfg.head, 0)
    check_choice("checkpoint", cfg.checkpoint, (BEST, LAST))
    check_attention_and_kernel(cfg.attention, cfg.kernel)
    resolve_device(cfg.device, option="device")


def run(cfg: HeadsConfig) -> Path:
    check(cfg)
    loaded = load_model(cfg.source, cfg.attention, cfg.kernel, checkpoint=cfg.checkpoint)
    model, tokenizer = loaded.model, loaded.tokenizer
    without = sorted({layout.name for layout, _ in model.config.layer_layouts if not layout.has_attention_maps})
    if without:
        raise ValueError(f"source={cfg.source}: attention={without[0]} layers have no attention maps (their heads "
                         f"read a state, not a softmax over keys); heads.py studies models whose every layer is "
                         f"softmax attention")  # fmt: skip
    paired = [i for i in range(model.config.n_layer) if model.config.layer_config(i).differential]
    if paired:
        raise ValueError(f"source={cfg.source}: layer {paired[0]} is differential attention (model.differential): "
                         f"each head is two softmax maps subtracted over two heads' values, so heads.py's maps and "
                         f"ablations, one per query head, would show halves of heads; it studies models without it")
    check_head(model, cfg.layer, cfg.head)
    device = resolve_device(cfg.device, option="device")
    model = model.to(device).eval()
    block = model.config.block_size
    x, y = validation_windows(replace(cfg.data, tokenizer=tokenizer.name), cfg.windows, block, device)
    out = Path(cfg.out) if cfg.out else default_out(cfg, loaded.path)
    start_up_over()  # the study begins
    out.mkdir(parents=True, exist_ok=True)
    # how it attends: its layout, and the options set that change what a head attends to (-rope, -sinks, ...)
    name = f"{loaded.name} ({'-'.join([model.config.attention, *attention_label(vars(model.config)).split('-')[2:]])})"
    sinks = model.config.in_any_layer("sinks")  # a schedule's layers without sinks: their rows sum to 1

    # Attention maps of one text.
    ids = tokenizer.encode(cfg.prompt)[-block:] if cfg.prompt is not None else x[0, : cfg.map_tokens].tolist()
    maps = attention_maps(model, torch.tensor([ids], device=device))[:, 0].cpu()  # (L, H, T, T)
    labels = [token_label(tokenizer.decode_bytes([t]).decode("utf-8", errors="replace")) for t in ids]
    text = map_text_caption(cfg, ids, tokenizer, block)
    sink_note = sink_caption(maps) if sinks else ""
    single = out / f"head_L{cfg.layer}_H{cfg.head}.png"
    where = f" (its tokens on the axes of {single.name})" if len(ids) > GRID_LABELED_TOKENS else ""
    plot_map_grid(maps, labels, out / "maps.png", f"attention maps, {name}\n{text}{where}{sink_note}",
                  sink_share=(1 - maps.sum(-1)).mean(-1) if sinks else None)  # fmt: skip
    one = maps[cfg.layer, cfg.head]
    plot_single_map(one, labels, single,
                    f"layer {cfg.layer}, head {cfg.head} of {name}\n{text}{sink_caption(one) if sinks else ''}")

    # Statistics over validation windows, one window at a time (maps are T x T per head).
    gates = gated(model.config)  # each head's mean output gate (model.gate) beside its map's statistics
    per_window = [{**head_statistics(attention_maps(model, x[i : i + 1]).cpu(), sinks),
                   **({GATE: gate_means(model, x[i : i + 1])} if gates else {})} for i in range(len(x))]  # fmt: skip
    names = stats_of(model.config)
    stats = {k: torch.stack([w[k] for w in per_window]).mean(0) for k in names}
    every_head = [(layer, head) for layer in range(model.config.n_layer) for head in range(model.config.n_head)]
    stat_rows = [[layer, head, *(stats[k][layer, head].item() for k in names)] for layer, head in every_head]
    write_table(out / "stats", ["layer", "head", *names], stat_rows)
    plot_head_heatmaps({f"{k} ({STAT_UNITS[k]})": stats[k] for k in names}, out / "stats.png",
                       f"per-head statistics over {len(x)} validation windows, {name}")  # fmt: skip

    # Ablation: the loss increase when each head alone is removed.
    removed = ablation(model, x, y)
    base, increase, error = removed.base, removed.increase, removed.standard_error
    ablation_header = ["layer", "head", "loss_increase", "standard_error", "loss_without_head"]
    ablation_rows = [[layer, head, increase[layer, head].item(), error[layer, head].item(),
                      base + increase[layer, head].item()] for layer, head in every_head]  # fmt: skip
    write_table(out / "ablation", ablation_header, ablation_rows)
    noise = sum(removed.noise(layer, head) for layer, head in every_head)
    plot_head_heatmaps({"val loss increase when removed": increase}, out / "ablation.png",
                       f"head ablation (val loss {base:.4f} with all heads; each increase's standard error over the "
                       f"{len(x)} windows {error.min():.4f} to {error.max():.4f}: {noise} of {len(every_head)} heads "
                       f"within 2 of them, noise), {name}", cmap="viridis")  # fmt: skip
    if cfg.prune:
        curve = greedy_pruning(model, x, y)
        write_table(out / "pruning", ["removed", "layer", "head", "loss"],
                    [[i, *(head if head else ("-", "-")), loss] for i, (head, loss) in enumerate(curve)])  # fmt: skip
        plot_pruning(curve, out / "pruning.png", f"greedy head pruning, {name}")

    ranked = sorted(every_head, key=lambda lh: increase[lh].item(), reverse=True)
    print(f"{name}: val loss {base:.4f}{base_noise(removed, len(x))} with all {len(every_head)} heads, over "
          f"{len(x)} windows (windows={cfg.windows}) of {block} tokens spread evenly over the validation split of "
          f"data={cfg.data.name}{other_windows(loaded, len(x))}", file=sys.stderr)  # fmt: skip
    print(f"most important heads (loss increase when removed, ± its standard error over the {len(x)} windows; "
          f"'noise': within 2 of them, no measured effect): "
          + ", ".join(f"L{layer}H{head} {increase[layer, head]:+.4f} ±{error[layer, head]:.4f}"
                      + (" noise" if removed.noise(layer, head) else "") for layer, head in ranked[:5]),
          file=sys.stderr)  # fmt: skip
    if noise == len(every_head):
        print(f"no head's removal changed the loss beyond its noise over {len(x)} windows: this ranking is noise "
              f"(more windows: windows=<n>, or a longer-trained model)", file=sys.stderr)
    if sinks:
        print(f"sinks: a row of each map sums to less than 1, the rest went to the head's sink: {SINK} in stats.md "
              f"(mean {stats[SINK].mean():.3f}, per head {stats[SINK].min():.3f} to {stats[SINK].max():.3f})",
              file=sys.stderr)  # fmt: skip
    if gates:
        shown = stats[GATE][~stats[GATE].isnan()]
        print(f"gate: each head's output times a sigmoid of the layer's input: {GATE} in stats.md (mean "
              f"{shown.mean():.3f}, per head {shown.min():.3f} to {shown.max():.3f}; near 0 a head is shut)",
              file=sys.stderr)  # fmt: skip
    left = remove_earlier_results(out, cfg)
    print(f"written to {out}/" + (f" (removed an earlier study's {', '.join(left)}, which this one did not write)"
                                 if left else ""), file=sys.stderr)  # fmt: skip
    if cfg.wandb:
        from analysis.wandb_report import log_report

        logger = (loaded.checkpoint.train_config or {}).get("logger", {}) if loaded.checkpoint else {}
        log_report("heads", f"heads-{loaded.name}", out,
                   {"head_stats": (["layer", "head", *names], stat_rows), "ablation": (ablation_header, ablation_rows)},
                   sorted(out.glob("*.png")), logger)  # fmt: skip
    return out


@hydra.main(version_base="1.3", config_path="configs", config_name="heads")
def main(cfg: DictConfig) -> None:
    with user_errors(USAGE):
        run(with_layout_options(OmegaConf.to_object(cfg)))


if __name__ == "__main__":
    refuse_renamed_options({"layout": "attention", "data_cache_dir": "data.cache_dir"})
    take_layout_options()
    take_text_options(("prompt",))  # any text, code too: Hydra's grammar would refuse parentheses and commas
    check_overrides("heads", "python heads.py")
    main()

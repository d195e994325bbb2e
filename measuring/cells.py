"""bench.py's grid: the attention cells its flags name (layout x kernel x key/value heads x window x
position x each option), each a GPTConfig checked as training checks it, and named as training names its runs."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import fields

from model import MIXERS, GPTConfig, registry
from model.attention import AttentionSpec
from model.attention.kernels import check_kernel_runs
from model.attention.modifications import with_fields
from model.config import attention_label
from model.device import resolve_device, resolve_dtype

COMPILE_MODES = ("eager", "compiled")
# The options that declare an axis of bench.py (``option(bench=...)``: issue 54's and 63's), each (its flag, its
# default, its help); the flag's values as typed give the option's. (A position, PaTH's, is a --position value; a
# cross-layer sharing a schedule's, --layer-kinds.)
AXES = {f.name: (f"--{f.name.replace('_', '-')}", f.default, f"{f.metadata['bench']} (model.{f.name})")
        for f in fields(AttentionSpec) if f.metadata.get("bench")}  # fmt: skip
# The axes whose values are scales, not counts of positions (SSMax's s: its declared type is a float), with a value that
# sets each (its declared example).
SCALES = {f.name: f.metadata["example"] for f in fields(AttentionSpec) if f.metadata.get("bench") and "float" in f.type}
# The attention options of issue 30, each a row field (and a CSV column) only where some cell sets it, and
# their defaults: a default grid's CSV has exactly step_times.FIELDS.
OPTION_DEFAULTS = {"position": "learned", **{mod.field: mod.off for mod in with_fields()}, "kv_latent": None,
                   "rope_head_dim": None, "layer_pattern": None, "layer_kinds": None,
                   **{field: default for field, (_, default, _) in AXES.items()}}  # fmt: skip


def default_layouts() -> list[str]:
    """The layouts of the canonical layout's function (fused_qkv, separate_qkv, wrapper): those that compute the
    same function; another function (attention=mla) is benchmarked when --layouts names it."""
    function = getattr(MIXERS[registry.canonical_layout()], "function", None)
    return sorted(name for name, cls in MIXERS.items() if getattr(cls, "function", None) == function)


def takes_latent(layout: str) -> bool:
    """Whether the layout keeps keys and values as a latent (it applies model.kv_latent)."""
    return "kv_latent" in MIXERS[layout].applies


def attention_cells(args: argparse.Namespace) -> list[dict]:
    """The grid's attention variants, in order: layout x kernel x key/value heads (attention=mla: its latent
    widths instead) x window x position x QK-norm x softcap x sinks."""
    cells = []
    for layout, kernel in itertools.product(args.layouts, args.kernels):
        latent = takes_latent(layout)
        shared = [(None, k) for k in args.kv_latent] if latent else [(kv, None) for kv in args.kv_heads]
        mods = [*with_fields(), *AXES]  # the modifications' fields, then issue 54's
        fields = [getattr(mod, "field", mod) for mod in mods]
        for (kv, k), window, position, *values in itertools.product(shared, args.window, args.position,
                                                                    *(getattr(args, field) for field in fields)):
            rope_dim = None
            if latent and registry.position(position).turns_queries_keys:
                rope_dim = args.rope_head_dim or max(2, args.n_embd // args.n_head // 4 * 2)
            cells.append(dict(layout=layout, kernel=kernel, kv_heads=kv, window=window, position=position,
                              **dict(zip(fields, values)), kv_latent=k,
                              rope_head_dim=rope_dim, layer_pattern=args.layer_pattern,
                              layer_kinds=args.layer_kinds))
    return cells


def config_of(args: argparse.Namespace, cell: dict, seq_len: int) -> GPTConfig:
    """The GPT of a cell (its attention block, in block mode), checked as training checks it."""
    kernel, backend = split_kernel(cell["kernel"])
    return GPTConfig(vocab_size=args.vocab_size, block_size=seq_len, n_layer=args.n_layer, n_head=args.n_head,
                     n_embd=args.n_embd, attention=cell["layout"], kernel=kernel, sdpa_backend=backend,
                     n_kv_head=cell["kv_heads"], window=cell["window"], position=cell["position"],
                     rope_theta=args.rope_theta, **{mod.field: cell[mod.field] for mod in with_fields()},
                     **{field: cell[field] for field in AXES},
                     kv_latent=cell["kv_latent"], rope_head_dim=cell["rope_head_dim"],
                     layer_pattern=cell["layer_pattern"],
                     layer_kinds=json.loads(cell["layer_kinds"] or "{}"))  # fmt: skip


def check_cells(args: argparse.Namespace) -> None:
    """Refuse a cell the model refuses, naming it and the reason; and a --kernels sdpa_<backend> that cannot run
    some cell's attention on the device, naming those that can."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    for cell, seq_len in itertools.product(attention_cells(args), args.seq_len):
        try:
            config = config_of(args, cell, seq_len)
        except ValueError as err:
            raise ValueError(f"cell {cell_label({**cell, 'n_head': args.n_head}, [])}: {err}") from None
        if split_kernel(cell["kernel"])[1] != "auto":
            check_kernel_runs(config, device, dtype, training=args.mode != "decode")


def split_kernel(name: str) -> tuple[str, str]:
    """A --kernels name -> (kernel, SDPA backend): ``sdpa_flash`` -> (sdpa, flash)."""
    return registry.split_kernel_option(name)


def kernel_of(name: str):
    """The kernel class (its facts) of a --kernels name."""
    return registry.kernel(split_kernel(name)[0])


def options_set(cell: dict) -> dict:
    """The cell's issue-30 options, each only where it departs from its default (a default row is as before)."""
    return {k: cell[k] for k, default in OPTION_DEFAULTS.items() if cell[k] != default}


def varied(rows: list[dict]) -> list[str]:
    """The optional axes (key/value heads, window, position encoding) that take more than one value in these
    rows: a label spells them even at their default."""
    heads = {r["kv_heads"] for r in rows if r.get("kv_latent") is None}  # a latent has no key/value heads
    axes = [key for key, seen in (("kv_heads", heads), ("window", {r["window"] for r in rows})) if len(seen) > 1]
    return axes + (["position"] if len({r.get("position", "learned") for r in rows}) > 1 else [])


def cell_label(r: dict, axes: list[str]) -> str:
    """The cell's attention as training names its runs (model.config.attention_label): ``wrapper-sdpa_flash-kv2``,
    ``fused_qkv-manual-rope-sinks``, spelling the key/value heads, window and position wherever the grid varies
    them."""
    kernel, backend = split_kernel(r["kernel"])
    model = {"attention": r["layout"], "kernel": kernel, "sdpa_backend": backend, "n_head": r["n_head"],
             "n_kv_head": r["kv_heads"], "window": r["window"],
             **{k: r.get(k, default) for k, default in OPTION_DEFAULTS.items()},
             "layer_kinds": json.loads(r.get("layer_kinds") or "{}")}  # fmt: skip
    return attention_label(model, show=[{"kv_heads": "n_kv_head"}.get(axis, axis) for axis in axes])

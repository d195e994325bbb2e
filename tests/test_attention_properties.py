"""Every cell of the attention grid is the formula at every shape, not at a few chosen ones.

A cell is a layout x kernel x key/value heads (multi-head, grouped, multi-query) x window (none, shorter and
longer than many of the lengths). Each is held to the float64 formula (tests/attention_reference.py) over
sequence lengths from 1 to past FlexAttention's block size (128): odd, prime, just below, at and above it,
batch sizes 1 to 3, two head counts (4 of 16, 6 of 8), in training mode (forward and every gradient) and in
eval mode. Cached decoding (the eager step and the static step a CUDA graph replays, eager and compiled) is held
to a full recomputation from prompts of many lengths, past the window.

The values of issue 30 are cells too: each position encoding (rope, alibi, none) and score modification
(qk_norm, softcap, sinks), alone and combined, in every layout and every kernel that takes it (sdpa refuses
softcap, naming manual and flex), held to the formula from their papers at lengths past the block size (each
query then sees at most block_size keys), in cached and static decoding, and in generation past block_size
(to 4 x block_size, with and without a window: every step's logits those of a full forward over the whole
sequence, the cache never growing).

The default run holds every cell to a fixed sample of shapes; ``pytest --deep`` (CI runs it too) sweeps
every length from 1 to 40, then primes and block boundaries to 257 (each plain cell in the head shape the default
run does not give it), more windows, and every layout x kernel x key/value heads of each new value. On a CUDA machine
every cell also runs there, flex with gradients.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Iterable

import pytest
import torch
from attention_reference import REFERENCED_MASKS, REFERENCES, Formula, Tolerance, formula_of, reference
from cell_failures import CellFailures
from grid_census import TIERS, Cell, registered_values, shortfalls, tally
from grid_floors import FLOORS
from helpers import CONFIGS, tiny_gpt_config
from omegaconf import OmegaConf

from model import GPT, KERNELS, MIXERS, KVCache, build_attention
from model.attention import AttentionSpec, kernels
from model.attention.modifications import with_fields
from model.attention.options import option_fields
from model.decoding.steps import CompiledStep, StaticStep
from model.registry import MASKS, MODIFICATIONS, POSITIONS, canonical_layout

# The layouts of one function, GPT-2's (the canonical layout's): the encoding grids' (attention=mla's encodings:
# tests/test_mla.py). The plain and decoding grids take every registered layer, each held to its function's formula.
GPT2_FUNCTION = getattr(MIXERS[canonical_layout()], "function", None)
LAYOUTS = sorted(name for name, cls in MIXERS.items() if getattr(cls, "function", None) == GPT2_FUNCTION)
ALL_LAYOUTS = sorted(MIXERS)
KERNEL_NAMES = sorted(KERNELS)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# n_head x head_dim, and each one's key/value heads: n_head, a divisor, 1.
HEAD_SHAPES = {"4x16": (4, 16, {"mha": 4, "gqa": 2, "mqa": 1}),
               "6x8": (6, 8, {"mha": 6, "gqa": 3, "mqa": 1})}  # fmt: skip
WINDOWS = {"full": None, "window5": 5, "window100": 100}  # 100: shorter than the long lengths, longer than most
# Primes, odd and even; 8 and 40 (where torch's CPU flex went wrong, 8 mod 16); below, at and past flex's block (128).
LENGTHS = [1, 2, 3, 5, 8, 13, 17, 40, 64, 127, 128, 129, 200]
# Every length to 40, then primes and the lengths around flex's blocks (128, 256) to past two of them. (A third block,
# to 385, cost a flex graph more per cell and the longest, costliest formulas: the deep sweep took 828 s with it, 696
# without, cold on 2 cores.)
DEEP_LENGTHS = [*range(1, 41), 41, 43, 47, 53, 59, 61, 63, 64, 65, 67, 71, 79, 89, 97, 101, 113, 127, 128, 129, 131,
                137, 149, 157, 160, 191, 255, 256, 257]  # fmt: skip
DEEP_WINDOWS = {"window1": 1, "window64": 64, "window129": 129}
# Each option's value that sets it (AttentionSpec's declarations): a mask's cell where the grid chooses none.
OPTION_EXAMPLES = {f.name: f.metadata["example"] for f in dataclasses.fields(AttentionSpec)
                   if f.name in option_fields()}  # fmt: skip



def near(failures: CellFailures, got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance, what: str,
         scale: float | None = None) -> None:
    """float32 against the float64 formula, within the formula's ``tolerance``, relative to ``scale`` (by default
    the tensor's own largest value); a miss is kept in ``failures``."""
    got, want = got.double(), want.double()
    atol, rtol = tolerance.bounds(want.abs().max().item() if scale is None else scale)
    failures.compare(got, want, atol, rtol, what)


def flex_unavailable(device: str) -> str | None:
    """Why kernel=flex cannot run here (it must then be refused, saying so), or None."""
    return kernels.flex_unavailable(torch.device(device))


def layout_defaults(layout: str) -> dict:
    """What the layout's config file sets beside its name (attention=mla: its latent width)."""
    path = CONFIGS / "attention" / f"{layout}.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}
    return {k: v for k, v in values.items() if k != "attention" and v is not None}


def kernels_of(layout: str) -> list[str]:
    """Every kernel for a layer that runs one; the default for one that runs its own form (Gated DeltaNet)."""
    return KERNEL_NAMES if MIXERS[layout].takes_kernel else [AttentionSpec.kernel]


def kv_names_of(layout: str) -> tuple[str, ...]:
    """Multi-head, grouped and multi-query key/value heads where the layer applies ``n_kv_head``; multi-head alone."""
    return ("mha", "gqa", "mqa") if "n_kv_head" in MIXERS[layout].applies else ("mha",)


def held(n_embd: int, n_head: int, kvs: list, start: int, options: dict):
    """The first of ``kvs`` (key/value head counts), from ``start`` on in turn, that ``options`` hold with ``n_head``
    heads (differential attention pairs key/value heads too: an odd count is refused)."""
    for kv in kvs[start:] + kvs[:start]:
        try:
            AttentionSpec(n_embd, n_head, n_kv_head=kv, **options)
        except ValueError:
            continue
        return kv
    raise AssertionError(f"no key/value heads of {kvs} hold {options} with {n_head} heads")


def mask_cells(layout: str, deep: bool) -> dict[str, dict]:
    """The mask options of a layer's cells (``model.registry.MASKS``, those it applies): none, then each mask's
    values, the window's chosen ones (WINDOWS), another's its option's example."""
    cells = {"full": {}}
    for mask in MASKS.values():
        if mask.field is None or mask.field not in MIXERS[layout].applies:
            continue
        if mask.field == "window":
            chosen = {**WINDOWS, **(DEEP_WINDOWS if deep else {})}
            cells |= {name: {"window": value} for name, value in chosen.items() if value is not None}
        else:
            example = OPTION_EXAMPLES[mask.field]
            cells[f"{mask.field}{example}"] = {mask.field: example}
    return cells


def cells(deep: bool):
    """Every registered layer x each kernel it runs x the key/value heads and masks it applies (as its class
    declares), each cell with one of the two head shapes, alternating (so each layout x kernel meets both). ``--deep``
    gives a cell of the default run the other shape (the two runs, both CI's, hold every such cell in both shapes)
    and its own cells (the deep windows) the shapes in turn."""
    shapes = list(HEAD_SHAPES.items())

    def combos(deep: bool) -> list:
        return [(layout, kernel, kv_name, mask) for layout in ALL_LAYOUTS for kernel in kernels_of(layout)
                for kv_name in kv_names_of(layout) for mask in mask_cells(layout, deep).items()]  # fmt: skip

    default_shape = {(layout, kernel, kv, m_name): i % 2 for i, (layout, kernel, kv, (m_name, _)) in
                     enumerate(combos(False))}  # fmt: skip
    for i, (layout, kernel, kv_name, (m_name, masks)) in enumerate(combos(deep)):
        turn = default_shape.get((layout, kernel, kv_name, m_name), i % 2)
        shape, (n_head, head_dim, kvs) = shapes[1 - turn if deep and (layout, kernel, kv_name, m_name) in
                                                default_shape else turn]  # fmt: skip
        n_kv = kvs[kv_name] if kv_name != "mha" else None
        yield pytest.param(layout, kernel, n_head, head_dim, n_kv, masks,
                           id=f"{layout}-{kernel}-{shape}-{kv_name}-{m_name}")  # fmt: skip


def pytest_generate_tests(metafunc):
    deep = metafunc.config.getoption("--deep")
    for name in GRIDS:  # each grid's fixture: its cells as this run gets them
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, [pytest.param(p.values, id=p.id, marks=p.marks) for p in scheduled(name, deep)])


@dataclasses.dataclass(frozen=True)
class Grid:
    """One grid of cells, a test's fixture: its cells (``make(deep)``, pytest params), what a cell's values exercise
    (``cell``, read by the census of tests/grid_census.py), and which of its cells only --deep runs."""

    make: Callable[[bool], Iterable]
    cell: Callable[..., Cell]
    deep_only: bool = False  # every cell compiles graphs of its own
    # the deep sweep runs one flex cell in this many (each compiles graphs of its own, 6-80 s of a fresh machine's CPU):
    # CI's 30 minutes
    flex_every: int = 1


def scheduled(name: str, deep: bool) -> list:
    """Grid ``name``'s cells as the run gets them, with the deep mark on those that only --deep runs: its flex cells,
    as each compiles graphs of its own, 10-30 s of a fresh machine's CPU (C++ builds), and --deep (which CI runs) holds
    them at every default length and more: one flex cell in a grid's ``flex_every`` (every other one of the plain and
    decoding grids' and the encodings', one in four of generation's past the context). The default tier
    compiles flex once, in the option effects' first flex cell (tests/test_options.py). A cell's kernel is read from
    its values, not from its name."""
    grid = GRIDS[name]
    params = list(grid.make(deep))
    flex = [i for i, p in enumerate(params) if grid.cell(*p.values).kernel == "flex"]
    marked = set(range(len(params))) if grid.deep_only else set(flex)
    dropped = set(flex) - set(flex[:: grid.flex_every])
    return [pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.deep]) if i in marked else p
            for i, p in enumerate(params) if i not in dropped]  # fmt: skip


def test_the_default_grids_reach_every_registered_layout_kernel_position_and_modification():
    """The grids take their names from the registries: a layout, kernel, position encoding or modification
    registered tomorrow gets cells in the default run, none lost to a round-robin over a fixed count."""
    alone = {tuple(options.items()) for options in ENCODINGS.values()}
    for name in POSITIONS:
        assert name == "learned" or (("position", name),) in alone, f"position={name} has no encoding cell"
    fields_alone = {tuple(options) for options in ENCODINGS.values()}
    for name, mod in MODIFICATIONS.items():  # ALiBi is a position encoding: its cell is above
        assert (mod.field,) in fields_alone or mod.field == "position", f"{name} has no cell of its own"
    for name in option_fields():  # every other option that changes the function: a cell of its own, or a mask's
        held = any(name in options for options in ENCODINGS.values()) or name in {m.field for m in MASKS.values()}
        # document masking is a mask of the tokens, not of positions: its proof holds every layer and kernel to the
        # documents computed alone (tests/test_document_masking.py); a cell here would hold one document. Sparse
        # attention's top-k is held to its formula in float64 (tests/test_sparse_attention.py): a float32 cell's top-k
        # could trade two keys whose index scores differ by round-off
        assert held or name in OWN_GRID or name in (
                                "n_kv_head", "dropout", "linear_chunk", "kv_latent", "rope_head_dim", "rope_scaling",
                                "rope_factor", "rope_original_length", "document_masking", "sparse_topk",
                                "indexer_heads", "indexer_dim"), \
            f"model.{name} has no cell"  # fmt: skip
    every = {(layout, kernel) for layout in ALL_LAYOUTS for kernel in kernels_of(layout)}
    assert {(p.values[0], p.values[1]) for p in cells(False)} == every, "the plain grid holds every layer and kernel"
    assert {(p.values[0], p.values[1]) for p in decode_cells()} == every, "and so does the decoding grid"
    grids = {
             "encoding_cells": ({(p.values[1], p.values[2]) for p in encoding_cells(False)}, None),
             "encoding_decode_cells": ({(p.values[1], p.values[2]) for p in encoding_decode_cells(False)}, None),
             "past_context_cells": ({(p.values[1], p.values[2]) for p in past_context_cells(False)}, None)}
    for name, options in ENCODINGS.items():  # an option no layer applies would be refused everywhere: no cell at all
        assert layers_applying(tuple(options.items())), f"no registered layer applies the encoding cell {name}"
    applying = {layout for options in ENCODINGS.values() for layout in layers_applying(tuple(options.items()))}
    for grid, (seen, expected) in grids.items():
        assert {layout for layout, _ in seen} == set(ALL_LAYOUTS if grid == "past_context_cells" else applying), grid
        assert {kernel for _, kernel in seen} == set(KERNEL_NAMES), grid
        assert expected is None or seen == expected, grid


def test_every_registered_function_and_mask_has_its_formula():
    """A layer of a function without a float64 formula, or a mask without one, would go unproven: refused here."""
    functions = {cls.function for cls in MIXERS.values()}
    assert functions <= set(REFERENCES), f"no float64 formula for {sorted(functions - set(REFERENCES))}"
    assert set(MASKS) <= set(REFERENCED_MASKS), f"no formula for the masks {sorted(set(MASKS) - set(REFERENCED_MASKS))}"
    assert {p.values[0] for p in past_context_cells(False)} == set(PAST_CONTEXT)
    assert {p.values[1] for p in past_context_cells(False)} == set(ALL_LAYOUTS), "every layer, past its context"


def seeded_block(layout, kernel, n_head, head_dim, n_kv, window, device, seed=0, **options):
    options = {**layout_defaults(layout), **({"window": window} if window else {}), **options}
    block = build_attention(layout, n_head * head_dim, n_head, kernel, n_kv_head=n_kv, **options).to(device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():  # larger than the 0.02 init: sharp attention, so a wrong mask shows
            # sinks as large as the scores: a sink that took no weight would prove nothing
            p.copy_(torch.randn(p.shape, generator=gen) * (3.0 if name == "sinks" else 0.3))
    return block


def lengths(config) -> list[int]:
    return DEEP_LENGTHS if config.getoption("--deep") else LENGTHS


@pytest.mark.parametrize("device", DEVICES)
def test_every_cell_is_the_formula_at_every_length_in_training_and_eval(cell, device, request):
    layout, kernel, n_head, head_dim, n_kv, masks = cell
    block = seeded_block(layout, kernel, n_head, head_dim, n_kv, masks.get("window"), device,
                         **{k: v for k, v in masks.items() if k != "window"})  # fmt: skip
    assert_block_is_the_formula(block, layout, kernel, n_head, n_kv, None, device, lengths(request.config))


def assert_block_is_the_formula(block, layout, kernel, n_head, n_kv, seen, device, sample, **options):
    """The block against the float64 formula of its function (``attention_reference.reference``, its options read
    from its spec) at each length of ``sample`` (batch 1-3 in turn), in eval mode and in training mode with the
    gradients of the input and of every parameter (not flex's on a CPU), each within its formula's tolerances
    (``REFERENCES``). Every length is checked: the cell fails once, naming each length where an output or a
    gradient lies outside them, and the lengths that hold."""
    C = block.c_proj.in_features
    if kernel == "flex" and flex_unavailable(device):
        with pytest.raises(ValueError, match="kernel=flex cannot run on this CPU"), torch.no_grad():
            block.eval()(torch.randn(1, 3, C, device=device))
        return
    grads = kernel != "flex" or device == "cuda"  # a CPU has no FlexAttention backward (torch 2.13)
    gen = torch.Generator(device=device).manual_seed(1)
    formula = formula_of(block)
    failures = CellFailures(f"{layout} x {kernel} against the {type(block).function} formula of "
                            f"tests/attention_reference.py (outputs: {formula.outputs}; gradients: "
                            f"{formula.gradients}, scale the largest of every gradient)")  # fmt: skip
    for i, T in enumerate(sample):
        B = 1 + i % 3
        x = torch.randn(B, T, C, device=device, generator=gen).requires_grad_(grads)
        weights = torch.randn(B, T, C, device=device, generator=gen) if grads else None  # the gradients' weighting
        with failures.at(T, f"T={T}, batch {B}"):
            formula_holds_at(block, x, weights, formula, failures)
    failures.raise_any()


def formula_holds_at(block, x: torch.Tensor, weights: torch.Tensor | None, formula: Formula,
                     failures: CellFailures) -> None:
    """One length of ``assert_block_is_the_formula``: the outputs in eval and training mode, and with ``weights``
    the gradients of sum(out * weights) by the input and every parameter."""
    with torch.set_grad_enabled(weights is not None):  # the formula once: its values here, its gradients below
        ref = reference(block, x)
    expected = ref.detach()
    with torch.no_grad():
        near(failures, block.eval()(x), expected, formula.outputs, "eval output")
    block.train()  # dropout 0: the training path (sdpa's dropout argument, flex's) computes the same
    if weights is None:
        with torch.no_grad():
            near(failures, block(x), expected, formula.outputs, "train output")
        return
    out = block(x)
    near(failures, out, expected, formula.outputs, "train output")
    params = [p for _, p in block.named_parameters()]
    got = torch.autograd.grad((out * weights).sum(), [x, *params])
    want = torch.autograd.grad((ref * weights.double()).sum(), [x, *params])
    # One scale for every gradient: some are zero in exact arithmetic (a key bias shifts a whole row of scores,
    # which softmax ignores) and in float32 keep the round-off of the terms that cancel.
    scale = max(w.abs().max().item() for w in want)
    for name, g, w in zip(["x", *(name for name, _ in block.named_parameters())], got, want):
        near(failures, g, w, formula.gradients, f"d/d{name}", scale)


# The values of issue 30: position encodings (model.position) and score modifications (model.qk_norm, softcap,
# sinks), alone and together. A small rope_theta in the combination turns the pairs fast: a wrong pairing or
# frequency shows within a few positions.
ENCODINGS = {
    # each registered position encoding and modification alone, at the value its option declares (registered
    # tomorrow: a cell here, with no edit); then combinations
    **{name: dict(position=name) for name in POSITIONS if name != AttentionSpec.position},
    **{mod.name: {mod.field: OPTION_EXAMPLES[mod.field]} for mod in with_fields()},
    "gate": dict(gate="elementwise"),
}
# Values together, written here: the only entries written by hand (the others come from the registries and the
# options' declarations). Being a combination is this table's, not the name's: a name is only a cell's id. Each
# gives its flex turn to flex in the default grid (``encoding_layouts_kernels``).
COMBINATIONS = {
    "rope500+qk_norm+softcap+sinks": dict(position="rope", rope_theta=500.0, qk_norm=True, softcap=3.0, sinks=True),
    "alibi+qk_norm+sinks": dict(position="alibi", qk_norm=True, sinks=True),
    "rope_fraction0.5+headgate+sinks": dict(position="rope", rope_fraction=0.5, gate="headwise", sinks=True),
    # (no rope_theta: at head dim 8 a quarter is one pair, whose frequency is 1 at any base, a setting refused)
    "rope_fraction+gate+qk_norm": dict(position="rope", rope_fraction=0.25, gate="elementwise", qk_norm=True),
    # Llama 4's NoPE layers: the queries' temperature after QK-norm, which would undo it
    "none+query_temperature+qk_norm": dict(position="none", query_temperature=4, qk_norm=True),
    # Gemma 4's global layers: the values are the keys before QK-norm and rotary turn them (the cache keeps both)
    "k_eq_v+rope+qk_norm": dict(k_eq_v=True, position="rope", qk_norm=True),
    # keys the encodings leave as projected: the cache keeps them alone, beside the forget gate's state per key
    "k_eq_v+alibi+forget_gate": dict(k_eq_v=True, position="alibi", forget_gate=True),
}
ENCODINGS |= COMBINATIONS


# Options whose cells live in a grid of their own: sparse attention's top-k picks keys by score, so its inputs are
# drawn where float32's round-off cannot change the pick, and its indexer has no gradient from the output
# (tests/test_sparse_attention.py: every layout and kernel at every length and top-k boundary, the deep sweep too);
# MoBA's blocks are chosen by a top-k of gates, as near ties go (tests/test_moba.py: every length and block boundary);
# NSA's likewise, by its compressed keys (tests/test_nsa.py: every length and block boundary, every softmax layout),
# and DeepSeek-V4's compressed attention by its entries (tests/test_compressed.py: the same, HCA and CSA).
OWN_GRID = {"sparse_topk", "moba_block", "moba_topk", "nsa_block", "nsa_topk", "nsa_window", "compress_ratio",
            "compress_topk", "compress_window"}


def options_of_their_own() -> dict[str, dict]:
    """Every other option that changes a layer's function, alone at the value it declares (with what it needs): not
    a mask's (the plain grid's cells) nor the key/value heads (every cell's), not one whose every value computes the
    same function, one a training sets (dropout) or a model-wide one (a reading's rotary scaling, a layout's own
    widths: tests/test_long_context.py, tests/test_mla.py), nor one that chooses among keys (``OWN_GRID``). Declared
    tomorrow: a cell here, with no edit."""
    held = {name for options in ENCODINGS.values() for name in options} | {m.field for m in MASKS.values()} | OWN_GRID
    own = {}
    for f in dataclasses.fields(AttentionSpec):
        meta = f.metadata
        if f.name in option_fields() and f.name not in held | {"n_kv_head"} and meta["per_layer"] and \
                meta["labelled"] and not meta["same_function"]:  # fmt: skip
            own[f.name] = {**meta["with"], f.name: meta["example"]}
    return own


# Computed once, before they join ENCODINGS (which then holds them: the function would find none left)
OWN_OPTIONS = options_of_their_own()
ENCODINGS |= OWN_OPTIONS
# The encodings without a position table: they read past block_size (rope, alibi, none).
PAST_CONTEXT = tuple(name for name, cls in POSITIONS.items() if cls.runs_past_context)
# The encoding cells' block size: the longest default length (200) and the deep ones past it read past the
# context, where each query sees at most ENCODING_BLOCK keys; window100 stays shorter than it.
ENCODING_BLOCK = 150
ENCODING_LENGTHS = [1, 2, 5, 8, 17, 40, 127, 129, 200]


def takes(kernel: str, options: dict) -> bool:
    """Whether the kernel applies every modification of the scores the options use (sdpa cannot cap scores: it
    has no step before the softmax), as the registries say."""
    return all(name in KERNELS[kernel].applies for name in score_modifications(options))


def score_modifications(options: dict) -> list[str]:
    """The modifications of the scores the options use (ALiBi's bias, softcap, sinks): flex's score_mod."""
    return [name for name, mod in MODIFICATIONS.items()
            if mod.on_scores and mod.field in options and mod.used(options[mod.field])]  # fmt: skip


def context(options: dict, window: int | None) -> int | None:
    """The keys a query sees at most (``AttentionSpec.context``): the window; past the context, no more than the block
    size."""
    if options.get("position", "learned") not in PAST_CONTEXT:
        return window
    return min(window or ENCODING_BLOCK, ENCODING_BLOCK)


@functools.cache
def layers_applying(options: tuple) -> list[str]:
    """The registered layers that apply every one of these options (their classes' declarations decide: a layer that
    would refuse them is left out), each proved against its own function's formula."""
    def builds(layout: str, kernel: str) -> bool:
        try:
            build_attention(layout, 64, 4, kernel, **{**layout_defaults(layout), **dict(options)})
        except ValueError:
            return False
        return True

    return [layout for layout in ALL_LAYOUTS if any(builds(layout, kernel) for kernel in kernels_of(layout))]


def encoding_layouts_kernels(e: int, name: str, options: dict, deep: bool, flex_turn: int):
    """The (layout, kernel) pairs of the ``e``-th encoding, over every registered layer that applies it: with
    ``deep`` each x every kernel it runs that takes it; by default each layer once, manual or sdpa in turn, and flex
    for GPT-2's layout at ``flex_turn`` when the encoding is one of ``COMBINATIONS`` or a modification of the scores
    that no combination holds. The encoding grids' flex cells are all deep (``scheduled``: a score_mod compiles
    graphs of its own): in the default run that layout meets the encoding in no cell, and --deep holds it with every
    kernel, flex in its turn's layout at every length."""
    layers = layers_applying(tuple(options.items()))
    kernels = {layout: [k for k in kernels_of(layout) if takes(k, options)] for layout in layers}
    # --deep: flex in the turn's layout alone, at every padded size. A CPU compiles one flex graph per padded size and
    # score_mod (7-15 s each with an empty compile cache), and these cells in every layout took over half the deep
    # sweep; flex receives the same tensors from every layout, each of which meets the encoding with manual and sdpa,
    # and flex at every length in the plain grid.
    if deep:
        turn = LAYOUTS[flex_turn]
        return [(layout, kernel) for layout in layers for kernel in kernels[layout]
                if kernel != "flex" or layout == turn]  # fmt: skip
    flexed = "+" in name or (score_modifications(options) and not any(
        set(score_modifications(options)) <= set(score_modifications(o)) for n, o in ENCODINGS.items() if "+" in n))
    pairs = []
    for i, layout in enumerate(layers):
        eager = [k for k in kernels[layout] if k != "flex"] or kernels[layout]
        flex = flexed and layout in LAYOUTS and LAYOUTS.index(layout) == flex_turn and "flex" in kernels[layout]
        pairs.append((layout, "flex" if flex else eager[(i + e) % len(eager)]))
    return pairs


def encoding_cells(deep: bool):
    """``--deep``: each encoding x every layout x every kernel that takes it (key/value heads, windows and head
    shapes turning with them), at every deep length. By default each encoding meets every layout once, with
    manual or sdpa in turn (key/value heads, windows, head shapes turning), but for the layout at its flex turn
    (``encoding_layouts_kernels``); flex, whose compilation per score_mod and padded shape costs seconds on a CPU,
    meets every encoding with --deep."""
    windows = list({**WINDOWS, **(DEEP_WINDOWS if deep else {})}.items())
    shapes = list(HEAD_SHAPES.items())
    for e, (name, options) in enumerate(ENCODINGS.items()):
        turns = encoding_layouts_kernels(e, name, options, deep, flex_turn=e % len(LAYOUTS))
        for c, (layout, kernel) in enumerate(turns):
            kv_names = kv_names_of(layout)
            (w_name, window), (shape, (n_head, head_dim, kvs)) = windows[(c + e) % len(windows)], shapes[(c + e) % 2]
            kv = held(n_head * head_dim, n_head, [kvs[n] for n in kv_names], (c + 2 * e) % len(kv_names), options)
            kv_name = next(n for n in kv_names if kvs[n] == kv)
            if "window" not in MIXERS[layout].applies:
                w_name, window = "full", None
            n_kv = kv if "n_kv_head" in MIXERS[layout].applies else None
            yield pytest.param(name, layout, kernel, n_head, head_dim, n_kv, window,
                               id=f"{name}-{layout}-{kernel}-{shape}-{kv_name}-{w_name}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_every_encoding_cell_is_the_formula_at_every_length_in_training_and_eval(encoding_cell, device, request):
    name, layout, kernel, n_head, head_dim, n_kv, window = encoding_cell
    options = ENCODINGS[name]
    block = seeded_block(layout, kernel, n_head, head_dim, n_kv, window, device, block_size=ENCODING_BLOCK,
                         **options)  # fmt: skip
    sample = DEEP_LENGTHS if request.config.getoption("--deep") else ENCODING_LENGTHS
    assert_block_is_the_formula(block, layout, kernel, n_head, n_kv, context(options, window), device, sample,
                                **options)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sdpa_refuses_softcap_naming_the_kernels_that_can(layout):
    with pytest.raises(ValueError) as refused:
        build_attention(layout, 64, 4, "sdpa", softcap=3.0)
    message = str(refused.value)
    assert "model.softcap=3.0" in message and "kernel=sdpa" in message, message
    assert "use kernel=manual or flex" in message, message


# Decoding: a tiny GPT whose context is short enough to decode to its end from every prompt length.
DECODE_BLOCK = 24
PROMPTS = [1, 5, 8, 13, 23]  # from one token, within the window of 7, a first fill past it, and late (--deep: all)
DEEP_PROMPTS = list(range(1, DECODE_BLOCK))
DECODE_WINDOWS = {"full": None, "window7": 7}
DECODE_ATOL = 1e-4  # a step's logits against the full forward's: two float32 computations of one function


def decode_model(layout, kernel, n_kv, window, device, block_size=DECODE_BLOCK, **options) -> GPT:
    torch.manual_seed(0)
    options = {**layout_defaults(layout), **({"window": window} if window else {}), **options}
    config = tiny_gpt_config(vocab_size=64, block_size=block_size, n_layer=2, n_head=4, n_embd=64, attention=layout,
                             kernel=kernel, n_kv_head=n_kv, **options)  # fmt: skip
    model = GPT(config).to(device).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):  # zeros at initialisation: logits of the scores' size instead
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0)
            else:
                p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def decode_cells():
    """Every registered layer x each kernel it runs x the key/value heads and masks it applies (as its class
    declares): the window's chosen decoding values (DECODE_WINDOWS), another mask's example."""
    for layout in ALL_LAYOUTS:
        kvs = (4, 2, 1) if "n_kv_head" in MIXERS[layout].applies else (None,)
        masks = {name: {"window": value} if value else {} for name, value in DECODE_WINDOWS.items()}
        masks = {**masks, **{n: m for n, m in mask_cells(layout, False).items() if "window" not in m and m}}
        if "window" not in MIXERS[layout].applies:
            masks = {n: m for n, m in masks.items() if "window" not in m}
        for kernel, n_kv, (m_name, mask) in itertools.product(kernels_of(layout), kvs, masks.items()):
            yield pytest.param(layout, kernel, n_kv, mask, id=f"{layout}-{kernel}-{n_kv or 4}kv-{m_name}")


def assert_decodes_like_full_recomputation(model, make_step, prompts, device, total=DECODE_BLOCK, batches=(1, 2, 3)):
    """From each prompt length (batch sizes ``batches`` in turn), fill the cache, then decode one position at a time
    to ``total`` positions (the end of the context, or past it for a model without a position table); every
    step's logits must be those of a full forward over the whole sequence at that position. A cache holds its
    window (or the context, when shorter), never the whole sequence, and never grows past it. Every prompt is
    checked: the cell fails once, naming each prompt and position that failed, and the prompts that hold."""
    config = model.config
    capacity = config.cache_capacity  # its masks' (the window), at most the context
    gen = torch.Generator(device=device).manual_seed(2)
    failures = CellFailures(f"cached decoding against a full forward over the whole sequence (logits within "
                            f"{DECODE_ATOL})", counted="prompt lengths", key="prompt")  # fmt: skip
    for i, prompt in enumerate(prompts):
        B = batches[i % len(batches)]
        idx = torch.randint(0, 64, (B, total), device=device, generator=gen)
        with failures.at(prompt, f"prompt {prompt}, batch {B}"), torch.inference_mode():
            full, _ = model(idx, idx)
            cache = KVCache(model.config.n_layer)
            first = model(idx[:, :prompt], cache=cache)[0][:, -1]
            failures.compare(first, full[:, prompt - 1], DECODE_ATOL, 0, "the prompt's last logits")
            held = {buffer.size(2) for buffer in cache.buffers()}
            if any(config.cache_widths):  # a KV cache (a linear layer keeps a state of fixed size instead)
                failures.check(held == {capacity}, f"the cache holds {held} positions, not {capacity}")
            bounded = cache.nbytes()
            # what the plan and the reports count (cache_widths x capacities, the states) is what the cache holds
            size = cache.buffers()[0].element_size() if cache.buffers() else 4
            failures.check(bounded == B * config.decoding_bytes(size), f"the cache holds {bounded} bytes, but the plan "
                           f"counts {B * config.decoding_bytes(size)} (cache_widths x capacities, the states)")
            step = make_step(model, cache, B)
            for t in range(prompt, total):
                failures.compare(step(idx[:, t : t + 1], t), full[:, t], DECODE_ATOL, 0, f"position {t}")
            failures.check(cache.nbytes() == bounded, "the cache grew past its capacity")
    failures.raise_any()


def eager_or_static(static: bool, device: str):
    """The cached step to hold: the eager one (the model with the cache) or the static one a CUDA graph replays."""
    def make_step(model, cache, batch):
        if static:
            return StaticStep(model, cache, batch, torch.device(device))
        return lambda tokens, t: model(tokens, cache=cache)[0][:, -1]

    return make_step


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_cached_decoding_is_a_full_recomputation_from_every_prompt_length(decode_cell, static, device, request):
    layout, kernel, n_kv, masks = decode_cell
    if kernel == "flex" and flex_unavailable(device):
        pytest.skip(flex_unavailable(device))
    model = decode_model(layout, kernel, n_kv, masks.get("window"), device,
                         **{k: v for k, v in masks.items() if k != "window"})  # fmt: skip
    prompts = DEEP_PROMPTS if request.config.getoption("--deep") else PROMPTS
    assert_decodes_like_full_recomputation(model, eager_or_static(static, device), prompts, device)


def encoding_decode_cells(deep: bool):
    """Each encoding with every layout (default: manual or sdpa in turn, flex for the combinations; ``--deep``:
    every kernel that takes it), key/value heads and window turning with them."""
    windows = list(DECODE_WINDOWS.items())
    for e, (name, options) in enumerate(ENCODINGS.items()):
        for i, (layout, kernel) in enumerate(encoding_layouts_kernels(e, name, options, deep,
                                                                   flex_turn=(e + 1) % len(LAYOUTS))):
            kvs = [4, 2, 1] if "n_kv_head" in MIXERS[layout].applies else [None]
            n_kv, (w_name, window) = held(64, 4, kvs, (i + 2 * e) % len(kvs), options), windows[(i + e) % 2]
            if "window" not in MIXERS[layout].applies:
                w_name, window = "full", None
            yield pytest.param(name, layout, kernel, n_kv, window, id=f"{name}-{layout}-{kernel}-{n_kv}kv-{w_name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_cached_decoding_with_each_encoding_is_a_full_recomputation(encoding_decode_cell, static, device, request):
    name, layout, kernel, n_kv, window = encoding_decode_cell
    if kernel == "flex" and flex_unavailable(device):
        pytest.skip(flex_unavailable(device))
    model = decode_model(layout, kernel, n_kv, window, device, **ENCODINGS[name])
    # --deep: every other prompt length (66 cells x 2 steps; every length is the plain cells' deep sweep)
    prompts = DEEP_PROMPTS[::2] if request.config.getoption("--deep") else [1, 5, 13, 23]
    assert_decodes_like_full_recomputation(model, eager_or_static(static, device), prompts, device)


# Generation past block_size: a model without a position table (rope, alibi, none) keeps going with no
# re-encoding, each position seeing at most cache_capacity keys (the window, or the block size), the cache a ring.
PAST_BLOCK = 16
PAST_TOTAL = 4 * PAST_BLOCK
PAST_PROMPTS = [1, 7, 16, 21]  # below, at and past block_size (a first fill longer than the cache)
PAST_WINDOWS = {"full": None, "window6": 6}


def past_context_cells(deep: bool):
    """rope, alibi, none x no window, a window (default: the layout and kernel turning with them; ``--deep``:
    every layout x kernel, with no score modification, sinks, or softcap and sinks in turn)."""
    combos = list(itertools.product(PAST_CONTEXT, PAST_WINDOWS.items()))
    mod_sets = ({}, {"sinks": True}, {"softcap": 3.0, "sinks": True})
    for c, (position, (w_name, window)) in enumerate(combos):
        if deep:
            grid = [(layout, kernel, mod_sets[(i + c) % 3])
                    for i, (layout, kernel) in enumerate(itertools.product(LAYOUTS, KERNEL_NAMES))]  # fmt: skip
        else:
            grid = [(LAYOUTS[c % len(LAYOUTS)], KERNEL_NAMES[(c + c // len(LAYOUTS)) % len(KERNEL_NAMES)], {})]
        for layout, kernel, mods in grid:
            if not takes(kernel, mods):
                mods = {"sinks": True}
            mod_id = "".join(f"+{k}" for k in mods)
            yield pytest.param(position, layout, kernel, window, mods,
                               id=f"{position}{mod_id}-{layout}-{kernel}-{w_name}")  # fmt: skip
    for layout in (name for name in ALL_LAYOUTS if name not in LAYOUTS):  # every other function, past its context
        for c, (position, (w_name, window)) in enumerate(combos):
            options = completed(layout, {"position": position, **({"window": window} if window else {})})
            if options is not None:
                kernel = kernels_of(layout)[c % len(kernels_of(layout))]
                extra = {k: v for k, v in options.items() if k not in ("position", "window")}
                yield pytest.param(position, layout, kernel, window, extra, id=f"{position}-{layout}-{kernel}-{w_name}")


def completed(layout: str, options: dict) -> dict | None:
    """The options a layer is built with for ``options``: its config file's, these, and what a refusal says it needs
    (``needs model.rope_head_dim=...``: attention=mla with rotary); None where it refuses them (Gated DeltaNet takes
    no rotary positions)."""
    options = {**layout_defaults(layout), **options}
    while True:
        try:
            MIXERS[layout].check_spec(AttentionSpec(64, 4, kernels_of(layout)[0], block_size=PAST_BLOCK,
                                                               **options))  # fmt: skip
            return options
        except ValueError as err:
            needed = [n for n in re.findall(r"needs model\.(\w+)=", str(err))
                      if n in OPTION_EXAMPLES and n not in options]  # fmt: skip
            if not needed:
                return None
            options = {**options, **{n: OPTION_EXAMPLES[n] for n in needed}}


@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_generation_past_block_size_is_a_full_forward_over_the_whole_sequence(past_context_cell, static):
    position, layout, kernel, window, mods = past_context_cell
    if kernel == "flex" and flex_unavailable("cpu"):
        pytest.skip(flex_unavailable("cpu"))
    n_kv = 2 if "n_kv_head" in MIXERS[layout].applies else None
    model = decode_model(layout, kernel, n_kv, window, "cpu", block_size=PAST_BLOCK, position=position, **mods)
    assert model.config.cache_capacity == min(window or PAST_BLOCK, PAST_BLOCK)
    assert_decodes_like_full_recomputation(model, eager_or_static(static, "cpu"), PAST_PROMPTS, "cpu", PAST_TOTAL)


# The deep sweep's (8-25 s each on a fresh machine): the default run compiles decoding in test_decoding.py.
COMPILED_CELLS = [*itertools.product(LAYOUTS, KERNEL_NAMES, (2,), (7,)), ("wrapper", "manual", 1, None)]


def compiled_cells(deep: bool):
    for layout, kernel, n_kv, window in COMPILED_CELLS:
        yield pytest.param(layout, kernel, n_kv, window, id=f"{layout}-{kernel}-{n_kv}kv-{window_id(window)}")


def test_the_compiled_static_step_is_a_full_recomputation(compiled_cell):
    layout, kernel, n_kv, window = compiled_cell
    if kernel == "flex" and flex_unavailable("cpu"):
        pytest.skip(flex_unavailable("cpu"))
    model = decode_model(layout, kernel, n_kv, window, "cpu")
    assert_decodes_like_full_recomputation(
        model, compiled_step, [1, 5, 8], "cpu", batches=COMPILED_BATCH)


# The compiled step is the static step (held at batch sizes 1 to 3 above) compiled for one batch size: one batch
# here, so that each prompt reuses its graph instead of compiling one more (seconds each on a CPU).
COMPILED_BATCH = (2,)


def compiled_step(model, cache, batch):
    return CompiledStep(model, cache, batch, torch.device("cpu"))


# The compiled static step past block_size, the deep sweep's: a rope model with a window (its ring wraps many
# times), alibi and none, and rope with sinks and softcap.
COMPILED_PAST_CELLS = [("rope", "fused_qkv", "sdpa", 6, {}),
                       ("alibi", "separate_qkv", "manual", None, {"sinks": True}),
                       ("none", "wrapper", "sdpa", 6, {}),
                       ("rope", "fused_qkv", "flex", 6, {"softcap": 3.0, "sinks": True})]  # fmt: skip


def compiled_past_cells(deep: bool):
    for position, layout, kernel, window, mods in COMPILED_PAST_CELLS:
        yield pytest.param(position, layout, kernel, window, mods,
                           id=f"{position}{''.join(f'+{k}' for k in mods)}-{layout}-{kernel}-{window_id(window)}")


def test_the_compiled_static_step_past_block_size_is_a_full_forward(compiled_past_cell):
    position, layout, kernel, window, mods = compiled_past_cell
    if kernel == "flex" and flex_unavailable("cpu"):
        pytest.skip(flex_unavailable("cpu"))
    model = decode_model(layout, kernel, 2, window, "cpu", block_size=PAST_BLOCK, position=position, **mods)
    assert_decodes_like_full_recomputation(model, compiled_step, [3, 21], "cpu", PAST_TOTAL, batches=COMPILED_BATCH)


# ------------------------------------------------------------------ the grids, and the cells each value has


def set_by_cell(layout: str, options: dict) -> dict:
    """The options a cell sets beyond its layout's config file (attention=mla's latent width is the layout's)."""
    defaults = layout_defaults(layout)
    return {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}


def windowed(window: int | None) -> dict:
    return {"window": window} if window else {}


def window_id(window: int | None) -> str:
    return f"window{window}" if window else "full"


def kv_of_past_context(layout: str) -> int | None:
    """The key/value heads of the past-context models: grouped, 2 of 4, where the layer applies them."""
    return 2 if "n_kv_head" in MIXERS[layout].applies else None


# Every grid (its test's fixture) -> how its cells are made and what each exercises: the run's cells and the census's.
# The decoding models have 4 heads (decode_model).
GRIDS = {
    "cell": Grid(cells, lambda layout, kernel, n_head, head_dim, n_kv, masks:
                 Cell(layout, kernel, n_head, n_kv, masks), flex_every=2),
    "encoding_cell": Grid(encoding_cells, lambda name, layout, kernel, n_head, head_dim, n_kv, window:
                          Cell(layout, kernel, n_head, n_kv, {**ENCODINGS[name], **windowed(window)}, name),
                          flex_every=2),
    "decode_cell": Grid(lambda deep: decode_cells(), lambda layout, kernel, n_kv, masks:
                        Cell(layout, kernel, 4, n_kv, masks), flex_every=2),
    "encoding_decode_cell": Grid(encoding_decode_cells, lambda name, layout, kernel, n_kv, window:
                                 Cell(layout, kernel, 4, n_kv, {**ENCODINGS[name], **windowed(window)}, name),
                                 flex_every=2),
    "past_context_cell": Grid(past_context_cells, lambda position, layout, kernel, window, mods:
                              Cell(layout, kernel, 4, kv_of_past_context(layout),
                                   set_by_cell(layout, {"position": position, **mods, **windowed(window)})),
                              flex_every=4),
    "compiled_cell": Grid(compiled_cells, lambda layout, kernel, n_kv, window:
                          Cell(layout, kernel, 4, n_kv, windowed(window)), deep_only=True),
    "compiled_past_cell": Grid(compiled_past_cells, lambda position, layout, kernel, window, mods:
                               Cell(layout, kernel, 4, 2, {"position": position, **mods, **windowed(window)}),
                               deep_only=True),
}  # fmt: skip


def census() -> dict[str, dict]:
    """Each run's count of the cells that exercise each value (tests/grid_census.py): the default run's cells (not
    those marked deep) and the --deep run's."""
    def cells_run(deep: bool):
        for name, grid in GRIDS.items():
            for p in scheduled(name, deep):
                if deep or not any(mark.name == "deep" for mark in p.marks):
                    yield grid.cell(*p.values)

    return {tier: tally(cells_run(tier == "deep")) for tier in TIERS}


def test_no_registered_value_loses_cells_in_the_default_or_the_deep_run():
    """Every registered value (each layout, kernel, position encoding, score modification, mask, other option and
    ENCODINGS entry) keeps at least the cells tests/grid_floors.py records for it, in all and with each layout,
    kernel, key/value heads and mask it met, in the default run and in --deep's: an entry added or changed that moves
    the turns of the others, or takes an option's own cells, fails here naming what lost cells."""
    problems = shortfalls(census(), FLOORS, registered_values(ENCODINGS))
    if problems:
        pytest.fail("\n".join([
            "The property grids lost cells (tests/grid_floors.py holds each value's floor: (default run, --deep run)):",
            *problems,
            "An entry added or changed in tests/test_attention_properties.py moved the turns that give each entry's "
            "cells their layout, kernel, key/value heads and window, or took another value's cells (see 'Adding a grid "
            "entry' in docs/ARCHITECTURE.md). If that is meant, rewrite the floors from the grids as they are, "
            "`python tests/grid_floors.py`, and say in the commit which value lost which cells and why "
            "(`git diff tests/grid_floors.py` shows every count that moved)."]), pytrace=False)  # fmt: skip

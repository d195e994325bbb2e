"""The attention options, and who applies each: declared, so that an option nobody applies is refused by
construction instead of silently ignored.

An option is a field of ``AttentionSpec`` that says what attention computes or how: every field but the block's
shape (``SHAPE``) and the choice of kernel (``KERNEL_CHOICE``, which a layer takes or not: ``takes_kernel``). An
option is *set* when it is away from its off value (its default; for ``n_kv_head``, also ``n_head``: multi-head).
Who applies what:

- a layer class (every layout, mla, gated_deltanet) lists the options it applies (``MultiHeadAttention.applies``),
  and applies the options its position encoding consumes (``PositionEncoding.fields``: rotary's base, fraction
  and scaling) where it applies ``position``;
- a kernel lists the effects it applies (``AttentionKernel.applies``: masks, score modifications, dropout);
- an option declares whether GPT-2's format holds it (``option(gpt2=True)``: ``model.checkpoints.gpt2_export``).

A set option that the layer does not apply is refused in one line, naming the option, the layer and those that
take it (``unapplied``, ``refusal``). A new field of ``AttentionSpec`` is therefore refused everywhere until a
layer says it applies it; ``tests/test_options.py`` walks every option x every layer, kernel and the export.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, fields

from model import registry

# what a block is built at, not an option of how it attends (kv_from: whether it projects keys and values at all)
SHAPE = ("n_embd", "n_head", "bias", "block_size", "kv_from")
KERNEL_CHOICE = ("kernel", "sdpa_backend")  # which kernel runs the softmax: a layer takes one or runs none
# The plan's terms (training/plan.py) a layer's option may change: its parameters, its mixing FLOPs per token
# (``mixing_flops``: the score and value matmuls, a key selection's own scores), its KV cache (numbers per token,
# ``cache_width``, and capacity), its decoding state of fixed size (``state_bytes``), its activations kept for backward
# (``activation_bytes``). An option declares the terms it changes (``option(plan=...)``; a position encoding, its
# class's ``plan``): tests/test_plan_terms.py holds it to change exactly those, so a term left inherited (a selection
# priced as dense attention) or changed undeclared fails.
PLAN_TERMS = ("parameters", "flops", "cache", "state", "activations")
# The stages of the attention pipeline that apply options (``model.attention.pipeline``), in order: an option of a stage
# (``option(stage=...)``) is applied by every layer that runs the pipeline (``STAGE_OPTIONS``); an option of no stage is
# a projection's, a position encoding's or a mixer's of its own form, which say so themselves.
STAGES = ("encodings", "key selection", "kernel", "combination", "gate")
# The stages of a family of mixers of their own form (model.mixers): an option of one is applied by every mixer that
# says it runs that stage (the delta rule's: Gated DeltaNet and KDA, which share its code in model.mixers.deltanet), so
# an option of the family is declared once and implemented once, with no edit of each mixer.
MIXER_STAGES = ("delta rule",)


def stage_options(stage: str, spec_class=None) -> frozenset[str]:
    """The options that declare ``stage`` (``option(stage=...)``)."""
    if spec_class is None:
        from model.attention.spec import AttentionSpec as spec_class
    return frozenset(f.name for f in fields(spec_class) if f.metadata.get("stage") == stage)
# The jobs within a stage that one option at a time does (``option(exclusive=...)``): two options of one job compute
# the same thing twice, so they must declare their conflict (the pair walk, tests/test_option_pairs.py, fails on a
# pair of one job that builds).
EXCLUSIVE = {
    "query scaling": "each scales the queries by how far they read",
    "key selection": "each chooses, beyond the masks, the keys a query attends",
}


@functools.cache
def option_fields(spec_class=None) -> tuple[str, ...]:
    """Every option of ``AttentionSpec`` (the class, passed to avoid an import circle), in its order."""
    if spec_class is None:
        from model.attention.spec import AttentionSpec as spec_class
    return tuple(f.name for f in fields(spec_class) if f.name not in SHAPE + KERNEL_CHOICE)


@functools.cache
def defaults_of(spec_class) -> dict:
    """Each field's default of a spec's class (an AttentionSpec, a GPTConfig): read once, not at each option a check
    asks of (the pair walk's thousands of configs spent a tenth of their time reading dataclass fields)."""
    return {f.name: f.default for f in fields(spec_class)}


def off_values(spec, name: str) -> tuple:
    """The values of option ``name`` that leave it off: its default (multi-head's ``n_head`` too)."""
    default = defaults_of(type(spec))[name]
    assert default is not MISSING, name
    return (default, spec.n_head) if name == "n_kv_head" else (default,)


def is_set(spec, name: str) -> bool:
    return getattr(spec, name) not in off_values(spec, name)


def applied(layout, spec) -> set[str]:
    """The options a layer of ``layout`` applies for ``spec``: its own, and its position encoding's where it applies
    positions (the encoding ``spec.position`` names; an unknown one is refused elsewhere)."""
    found = set(layout.applies)
    encoding = registry.POSITIONS.get(spec.position)
    if "position" in found and encoding is not None:
        found |= set(encoding.fields)
    return found


def takers(name: str) -> list[str]:
    """Who applies option ``name``, as options choose them: ``attention=mla``, ``model.position=rope``."""
    layouts = [f"attention={n}" for n, cls in registry.MIXERS.items() if name in cls.applies]
    positions = [f"model.position={n}" for n, cls in registry.POSITIONS.items() if name in cls.fields]
    return layouts + positions


def unapplied(layout, spec) -> list[tuple[str, object, tuple]]:
    """The options ``spec`` sets that a layer of ``layout`` does not apply: (name, value, its off values)."""
    mine = applied(layout, spec)
    return [(name, getattr(spec, name), off_values(spec, name)) for name in option_fields(type(spec))
            if name not in mine and is_set(spec, name)]  # fmt: skip


def spelled(value) -> str:
    """A value as an override types it: ``null``, ``true``, ``30.0``, ``headwise``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def refusal(layout, spec, name: str, value, offs: tuple) -> str:
    """The one line that refuses ``name=value`` for a layer of ``layout``: who takes it, or, where none does, that
    no one has said they apply it (a new option)."""
    off = spelled(offs[0])
    who = takers(name)
    if not who:
        return (f"model.{name}={spelled(value)} is applied by no attention layer (an option no layer declares in its "
                f"applies: a new option is refused until one does); set model.{name}={off}")  # fmt: skip
    layouts = [w for w in who if w.startswith("attention=")]
    here = f"attention={layout.name}" if layouts else f"model.position={spec.position}"
    why = getattr(layout, "cannot_hold", {}).get(name)  # a stage's option its projection cannot hold, and why
    return (f"model.{name}={spelled(value)} is an option of {' or '.join(who)}, but {here}"
            f"{f' ({why})' if why else ''}; use {' or '.join(who)}, or model.{name}={off}")  # fmt: skip


def check_applied(layout, spec) -> None:
    """Refuse the first option ``spec`` sets that a layer of ``layout`` does not apply (``refusal``), then what its
    position encoding says the layer cannot hold (``PositionEncoding.refusal``); then, for a layer that runs a kernel,
    what its options ask of the kernel and the kernel does not apply."""
    for name, value, offs in unapplied(layout, spec):
        raise ValueError(refusal(layout, spec, name, value, offs))
    encoding = registry.POSITIONS.get(spec.position)
    if encoding is not None and "position" in layout.applies and (problem := encoding.refusal(layout, spec)):
        raise ValueError(problem)  # what the layer's projection cannot hold of its position encoding (PaTH: MLA's)
    if layout.takes_kernel:
        spec.check_kernel_applies()


@functools.cache
def declared_conflicts(spec_class=None) -> dict[tuple[str, str], str]:
    """Every pair of options declared unable to coexist (``option(conflicts=...)``, either side), with why (one dict,
    kept: read it, never write it)."""
    if spec_class is None:
        from model.attention.spec import AttentionSpec as spec_class
    pairs = {}
    for f in fields(spec_class):
        for other, why in f.metadata.get("conflicts", {}).items():
            pairs[tuple(sorted((f.name, other)))] = why
    return pairs


def check_conflicts(spec, declared: dict[tuple[str, str], str] | None = None) -> None:
    """Refuse two options set together that declare they cannot coexist (``declared``: every declared pair), in one
    line naming both and why."""
    for (a, b), why in (declared_conflicts(type(spec)) if declared is None else declared).items():
        if is_set(spec, a) and is_set(spec, b):
            raise ValueError(f"model.{a}={spelled(getattr(spec, a))} and model.{b}={spelled(getattr(spec, b))} cannot "
                             f"both be set: {why}; set model.{a}={spelled(off_values(spec, a)[0])} or "
                             f"model.{b}={spelled(off_values(spec, b)[0])}")  # fmt: skip

"""Each option's plan terms are its own (issue 61, goal 6): an option declares which of the plan's terms it changes
(``option(plan=...)`` in ``model.attention.spec``; a position encoding, its class's ``plan``), and in every layer
that applies it, a one-layer model with it and without it differs in exactly those terms.

The plan's terms (``PLAN_TERMS``) are read as training/plan.py reads them: parameters and the mixing FLOPs per token
(``model_counts``, ``mixing_flops``), the KV cache per token and its capacity (``cache_width``, ``cache_capacities``),
a linear layer's decoding state (``state_bytes``), the activations kept for backward (``activation_bytes``). A term an
option should change but inherits (MoBA priced as dense attention, PaTH keeping nothing for backward) is equal with
and without it, and fails here; so does a term it changes without saying so. The settings and the layers come from
the declarations (tests/test_option_pairs.py's walk): a new option is held here with no edit.
"""

from __future__ import annotations

import functools

import pytest
import torch
from test_option_pairs import DECLARED, SETTINGS, config_defaults

from model import MIXERS, GPTConfig
from model.attention.options import PLAN_TERMS, spelled
from model.gpt import score_flops
from model.registry import POSITIONS
from training.plan import activation_bytes, model_counts

# Options whose unset side no layer builds: MLA refuses rotary positions without its rotary key width
UNCOMPARED = {"rope_head_dim": "attention=mla refuses model.position=rope without it"}


@functools.cache
def terms(layout: str, options: tuple) -> dict[str, object] | None:
    """The plan's terms of a one-layer model of ``layout`` with ``options`` ((name, value) pairs), as the plan reads
    them; None where the model is refused."""
    fields_of = {**dict(config_defaults(layout)), **dict(options)}
    if fields_of.get("document_masking"):
        fields_of["document_end"] = 0
    mixer = MIXERS[layout]
    try:  # the manual kernel keeps the scores: an option's share of them shows
        config = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=4, n_embd=16, attention=layout,
                           kernel="manual" if mixer.takes_kernel else "sdpa", **fields_of)  # fmt: skip
        mixer.check_spec(config.attention_spec)
        params, _ = model_counts(config)
    except ValueError:
        return None
    spec = config.attention_spec
    return {"parameters": params, "flops": score_flops(mixer, spec, config.block_size),
            "cache": (mixer.cache_width(spec), tuple(config.cache_capacities)), "state": mixer.state_bytes(spec, 2),
            "activations": activation_bytes(config, 2, torch.bfloat16)}  # fmt: skip


def unset_side(name: str, needs: dict) -> dict:
    """What an option needs, less the needs that need it in turn (rotary's scaling needs a factor, which needs a
    scaling): the model without it."""
    return {n: v for n, v in needs.items() if n not in DECLARED or name not in DECLARED[n].metadata["with"]}


def compared() -> list[tuple[str, object, dict, dict, tuple[str, ...]]]:
    """Each option setting against its unset side: (option, value, the options both sides set, the set side's, the
    terms it declares). A position encoding is held against no positions (model.position=none), each by its class's
    ``plan``; the default (learned) too."""
    found = []
    for name, value, needs in SETTINGS:
        if name not in DECLARED or name in UNCOMPARED:
            continue
        if name == "position":
            found.append((name, value, {**needs, "position": "none"}, {**needs, name: value}, POSITIONS[value].plan))
        else:
            plan = DECLARED[name].metadata["plan"]
            found.append((name, value, unset_side(name, needs), {**needs, name: value}, plan))
    return [*found, ("position", "learned", {"position": "none"}, {}, POSITIONS["learned"].plan)]


@pytest.mark.parametrize("setting", compared(), ids=lambda s: f"{s[0]}={spelled(s[1])}")
def test_an_option_changes_exactly_the_plan_terms_it_declares_in_every_layer_that_applies_it(setting):
    name, value, without, with_it, declared = setting
    assert set(declared) <= set(PLAN_TERMS)
    problems, layers = [], []
    for layout in MIXERS:
        off, on = terms(layout, tuple(sorted(without.items()))), terms(layout, tuple(sorted(with_it.items())))
        if off is None or on is None:
            continue  # refused (the option walks hold the refusal)
        layers.append(layout)
        changed = {term for term in PLAN_TERMS if off[term] != on[term]}
        if inherited := set(declared) - changed:
            problems.append(f"attention={layout}: model.{name}={spelled(value)} declares that it changes the plan's "
                            f"{', '.join(sorted(inherited))}, but the plan counts the same without it (a term "
                            f"inherited, not its own)")  # fmt: skip
        if undeclared := changed - set(declared):
            problems.append(f"attention={layout}: model.{name}={spelled(value)} changes the plan's "
                            f"{', '.join(sorted(undeclared))}, which it does not declare (option(plan=...))")
    assert layers, f"model.{name}={spelled(value)}: no layer builds it and its unset side: nothing was compared"
    assert not problems, "\n".join(problems)


def test_every_option_is_compared_or_says_why_not():
    """The walk is only as good as its settings: every option but those said why is compared, and each encoding."""
    walked = {s[0] for s in compared()}
    assert walked | set(UNCOMPARED) == set(DECLARED)
    assert {s[1] for s in compared() if s[0] == "position"} == set(POSITIONS)

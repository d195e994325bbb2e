"""Every pair of options, in every layer: refused in one line naming both, or each changes the function (issue 60).

The single-option walk (tests/test_options.py) holds each option alone; an option can still vanish beside another
(fused_qkv once skipped the query temperature under rotary positions: a fast path from its projection to rotary).
Here every pair of option settings (each option at its example and at every other value it declares, ``values``),
in every registered layer, is built as a one-layer GPT, the path a user's config takes, and is either

- refused, in one line that names both options (a pair that cannot coexist; two options that declare one job within
  their stage, ``option(exclusive=...)``: two query scalings, must be), or
- built, and then turning either option off (the other kept) changes every position's output somewhere.

And the layouts of GPT-2's function compute one function for every pair they build, from one set of weights.
The options, their values and the layers all come from the declarations: a new option is walked with no edit here.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import zlib
from dataclasses import fields, replace

import pytest
import torch
from helpers import GPT2_LAYOUTS
from test_options import layout_defaults
from torch import nn

from model import GPT, MIXERS, GPTConfig
from model.attention import AttentionSpec
from model.attention.options import EXCLUSIVE, applied, option_fields, spelled
from model.registry import SELECTIONS

N_EMBD, N_HEAD, T, VOCAB, END = 16, 4, 12, 32, 0  # END: the token that ends a document (document masking)
DECLARED = {f.name: f for f in fields(AttentionSpec) if f.name in option_fields()}
# GPTConfig's own options: what the model does around its attention (positions restarted per document)
MODEL_OPTIONS = {"document_positions": (True, {"document_masking": True})}


def settings(name: str) -> list[tuple]:
    """Option ``name`` set: each value that sets it (its example first, then every other it declares: rotary and no
    positions beside ALiBi), with the options each needs."""
    if name in MODEL_OPTIONS:
        value, needs = MODEL_OPTIONS[name]
        return [(value, needs)]
    field = DECLARED[name]
    values = dict.fromkeys((field.metadata["example"], *field.metadata["values"]))
    return [(value, field.metadata["with"]) for value in values if value != field.default]


NAMES = sorted([*DECLARED, *MODEL_OPTIONS])
SETTINGS = [(name, value, needs) for name in NAMES for value, needs in settings(name)]


def off_value(name: str):
    return False if name in MODEL_OPTIONS else DECLARED[name].default


@functools.cache
def config_defaults(layout: str) -> tuple:
    return tuple(layout_defaults(layout).items())


@contextlib.contextmanager
def no_initial_draws():
    """Modules built without drawing their initial weights, which the walk replaces (most of a build's time, over a
    thousand builds per layer)."""
    classes = (nn.Linear, nn.Embedding, GPT)
    saved = [cls.__dict__["reset_parameters"] for cls in classes]
    for cls in classes:
        cls.reset_parameters = lambda self: None
    try:
        yield
    finally:
        for cls, method in zip(classes, saved):
            cls.reset_parameters = method


@functools.cache
def built(layout: str, options: tuple) -> GPT | Exception:
    """A one-layer GPT of ``layout`` with ``options`` ((name, value) pairs; and the layout's config defaults), each
    parameter drawn N(0, 0.25) from a seed of its name (larger than the init's, so an option's effect shows; two
    models share every parameter they both have), or what refused it. Kept: a walk builds each model once."""
    fields_of = {**dict(config_defaults(layout)), **dict(options)}
    if fields_of.get("document_masking"):
        fields_of["document_end"] = END
    try:
        config = GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=N_HEAD, n_embd=N_EMBD, attention=layout,
                           kernel="manual", **fields_of)  # fmt: skip
        with no_initial_draws():
            gpt = GPT(config)
    except Exception as err:  # a ValueError is a refusal; anything else a crash, which the walk reports
        return err
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))) * 0.5)
    return gpt


def model(layout: str, options: dict) -> GPT | Exception:
    return built(layout, key(options))


@functools.cache
def outputs_of(layout: str, options: tuple) -> torch.Tensor | Exception:
    """The kept model's ``outputs``, or the error its forward raised (a bad pair built but not refused)."""
    try:
        return outputs(built(layout, options))
    except Exception as err:
        return err


TOKENS = torch.randint(1, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
TOKENS[:, T // 2] = END  # two documents: what document masking and positions per document read


def outputs(gpt: GPT, training: bool = True) -> torch.Tensor:
    """Every position's last hidden state: in training mode with the dropout masks of one seed (what dropout
    changes; not ``training``: in eval mode, where it drops nothing), else in eval mode."""
    dropping = training and gpt.config.dropout > 0
    if dropping:
        torch.manual_seed(2)
    with torch.no_grad():
        return gpt.train(dropping).hidden_states(TOKENS)


def pair_options(first: tuple, second: tuple) -> dict:
    """Both settings with what they need; the two settings win over a need (a need of one for another value of the
    other is a pair that cannot coexist)."""
    (a, va, needs_a), (b, vb, needs_b) = first, second
    return {**needs_a, **needs_b, a: va, b: vb}


def accepted_alone(layout: str, setting: tuple) -> bool:
    name, value, needs = setting
    return not isinstance(model(layout, {**needs, name: value}), Exception)


def pairs(layout: str) -> list[tuple[tuple, tuple]]:
    """Every pair of settings of two options that ``layout`` takes alone (one it refuses alone is the single walk's)."""
    alone = [s for s in SETTINGS if accepted_alone(layout, s)]
    return [(x, y) for x, y in itertools.combinations(alone, 2) if x[0] != y[0]]


def named(message: str, setting: tuple) -> bool:
    """Whether a refusal names the setting: its option, or an option it needs (the pair's conflict is with the need:
    rotary's base beside positions that restart per document is rotary beside them)."""
    name, _, needs = setting
    return any(f"model.{n}=" in message for n in (name, *needs))


@pytest.mark.parametrize("layout", sorted(MIXERS))
def test_every_pair_of_options_is_refused_naming_both_or_each_changes_the_function(layout):
    problems = []
    for first, second in pairs(layout):
        options = pair_options(first, second)
        both = model(layout, options)
        (a, va, _), (b, vb, _) = first, second
        where = f"attention={layout} model.{a}={spelled(va)} model.{b}={spelled(vb)}"
        if not isinstance(both, Exception) and (job := one_job(first, second)):
            problems.append(f"{where}: built, but both do one job ({job}: {EXCLUSIVE[job]}); declare their conflict "
                            f"(option(conflicts=...))")  # fmt: skip
            continue
        if isinstance(both, Exception):
            message = f"{type(both).__name__}: {both}"
            if not isinstance(both, ValueError) or "\n" in message or not (named(message, first) and
                                                                            named(message, second)):  # fmt: skip
                problems.append(f"{where}: refused without naming both in one line: {message}")
            continue
        for name in (a, b):
            without = {**options, name: off_value(name)}
            if isinstance(model(layout, without), Exception):  # the other needs it (rope_theta: rotary positions)
                continue
            on, off = outputs_of(layout, key(options)), outputs_of(layout, key(without))
            crashed = next((out for out in (on, off) if isinstance(out, Exception)), None)
            if crashed is not None:
                problems.append(f"{where}: built, then its forward raised {type(crashed).__name__}: {crashed}")
            elif torch.allclose(on, off, atol=1e-6, rtol=1e-5):
                problems.append(f"{where}: model.{name} changes nothing beside the other")
    assert not problems, f"{len(problems)} pairs:\n" + "\n".join(problems)


BRANCHED = [cls for cls in SELECTIONS.values() if cls.branches]  # selections that add attentions of their own (NSA's)


@pytest.mark.parametrize("selection", BRANCHED, ids=lambda cls: cls.name)
def test_an_option_beside_a_selection_of_branches_changes_each_branch(selection):
    """An option built beside a selection that attends in branches (NSA: compressed, selected, sliding) is applied in
    every branch: with one branch alone (``KeySelection.alone``), turning the option off changes the function, in
    every layer that builds the pair. An option the pair walk finds effective can still be half-applied: a sink added
    to the kernel's softmax and not to the compressed one changes the selected and sliding branches only."""
    problems, checked = [], 0
    for layout in sorted(MIXERS):
        mine = [s for s in SETTINGS if s[0] == selection.field and accepted_alone(layout, s)]
        others = [s for s in SETTINGS if s[0] not in DECLARED or DECLARED[s[0]].metadata["exclusive"] != "key "
                  "selection" and selection.field not in s[2]]  # fmt: skip
        for first, second in itertools.product(mine, others):
            options = pair_options(first, second)
            name, value, _ = second
            without = {**options, name: off_value(name)}
            on, off = model(layout, options), model(layout, without)
            if isinstance(on, Exception) or isinstance(off, Exception):
                continue  # refused (the walk above holds the refusal)
            for branch in selection.branches:
                for gpt in (on, off):
                    for block_selection in selected_modules(gpt, selection):
                        block_selection.alone = branch
                try:
                    same = torch.allclose(outputs(on), outputs(off), atol=1e-6, rtol=1e-5)
                finally:
                    for gpt in (on, off):
                        for block_selection in selected_modules(gpt, selection):
                            block_selection.alone = None
                checked += 1
                if same:
                    problems.append(f"attention={layout} model.{first[0]}={spelled(first[1])}: model.{name}="
                                    f"{spelled(value)} changes nothing in the {branch} branch alone (applied in some "
                                    f"branches only: apply it there, or declare its conflict)")  # fmt: skip
    assert checked, f"no option built beside {selection.name}"
    assert not problems, f"{len(problems)} options:\n" + "\n".join(problems)


def selected_modules(gpt: GPT, selection: type) -> list:
    return [module for module in gpt.modules() if isinstance(module, selection)]


def one_job(first: tuple, second: tuple) -> str | None:
    """The job within a stage both settings' options declare they do, one option at a time (``option(exclusive=...)``:
    two query scalings), or None; an option that needs the other (MoBA's top-k its blocks) does it with it."""
    (a, _, needs_a), (b, _, needs_b) = first, second
    jobs = [DECLARED[n].metadata["exclusive"] if n in DECLARED else None for n in (a, b)]
    return jobs[0] if jobs[0] is not None and jobs[0] == jobs[1] and a not in needs_b and b not in needs_a else None


def key(options: dict) -> tuple:
    return tuple(sorted(options.items()))


def test_the_walk_covers_every_option_and_its_declared_values():
    """The walk is only as good as its settings: every option is set, at every value it declares."""
    assert {name for name, _, _ in SETTINGS} == set(NAMES) and len(NAMES) == len(DECLARED) + len(MODEL_OPTIONS)
    assert ("position", "rope", {}) in SETTINGS and ("position", "none", {}) in SETTINGS


def converted(target_layout: str, source: GPT, options: dict) -> GPT:
    """A new model of ``target_layout`` (not the walk's kept one) holding ``source``'s weights, converted."""
    gpt = GPT(replace(source.config, attention=target_layout))
    gpt.load_weights(source.state_dict())
    return gpt


GPT2_OPTIONS = applied(MIXERS[GPT2_LAYOUTS[0]], AttentionSpec(N_EMBD, N_HEAD, position="rope"))


@pytest.mark.parametrize("first", [s for s in SETTINGS if s[0] in GPT2_OPTIONS or s[0] in MODEL_OPTIONS],
                         ids=lambda s: f"{s[0]}={spelled(s[1])}")  # fmt: skip
@pytest.mark.slow
def test_the_gpt2_layouts_compute_one_function_for_every_pair_they_build(first):
    """fused_qkv, separate_qkv and wrapper, each with the pair, from one set of weights (converted): one output at
    every position (to round-off: their arithmetic is ordered differently), in eval mode (dropout's masks are drawn
    per kernel call, which the layouts make differently)."""
    checked, problems = 0, []
    for second in SETTINGS:
        if second[0] == first[0]:
            continue
        options = pair_options(first, second)
        takers = [layout for layout in GPT2_LAYOUTS if not isinstance(model(layout, options), Exception)]
        if len(takers) < 2:
            continue
        source_layout, source = takers[0], model(takers[0], options)
        expected = outputs(source, training=False)
        for layout in takers[1:]:
            got = outputs(converted(layout, source, options), training=False)
            if not torch.allclose(got, expected, atol=2e-5, rtol=2e-5):
                problems.append(f"{layout} vs {source_layout} with {options}: max difference "
                                f"{(got - expected).abs().max():.3g}")  # fmt: skip
            checked += 1
    assert checked, f"no pair with {first} built in two GPT-2 layouts"
    assert not problems, "\n".join(problems)


def test_every_declared_conflict_is_refused_in_one_line_naming_both_and_why():
    """An option declares the options it cannot coexist with (``option(conflicts=...)``): refused together, in one
    line naming both and why, in every layer that applies both (the walk above holds every other pair to change the
    function). The mechanism too, on a pair declared here: today's options all coexist."""
    from model.attention.options import check_conflicts, declared_conflicts

    for (a, b), why in declared_conflicts().items():
        fa, fb = DECLARED[a].metadata, DECLARED[b].metadata
        # the layers that take each alone (one that refuses either names that one alone: the single walk's)
        takers = [layout for layout in sorted(MIXERS) if accepted_alone(layout, (a, fa["example"], fa["with"]))
                  and accepted_alone(layout, (b, fb["example"], fb["with"]))]  # fmt: skip
        assert takers, f"no layer takes model.{a} and model.{b} each alone: their conflict is never met"
        for layout in takers:
            both = model(layout, {**fa["with"], **fb["with"], a: fa["example"], b: fb["example"]})
            assert isinstance(both, ValueError), f"attention={layout} took model.{a} with model.{b}: {why}"
            assert f"model.{a}=" in str(both) and f"model.{b}=" in str(both), str(both)
    spec = AttentionSpec(N_EMBD, N_HEAD, sinks=True, softcap=3.0)
    with pytest.raises(ValueError, match=r"^model.sinks=true and model.softcap=3.0 cannot both be set: a reason; set "
                                         r"model.sinks=false or model.softcap=null$"):  # fmt: skip
        check_conflicts(spec, {("sinks", "softcap"): "a reason"})
    check_conflicts(AttentionSpec(N_EMBD, N_HEAD, sinks=True), {("sinks", "softcap"): "a reason"})  # one alone: taken

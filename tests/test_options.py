"""Every attention option is applied or refused, in every layer, every kernel and the export (issue 52, item 1).

An option (``model.attention.options``: every field of ``AttentionSpec`` but the shape and the kernel's choice) set away
from its off value is, for each registered layer: refused in one line naming it (and, where another layer takes
it, that layer), or applied: the block then computes another function than with the option off (but for an
option that says every value is the same function, a chunk size). For each kernel, the masks and modifications an
option asks of it are applied (the output moves) or refused naming the kernel. The export refuses every option
GPT-2's format does not hold. The options, their example values, the layers and the kernels all come from the
registries and ``AttentionSpec``'s own declarations: an option added tomorrow is walked here with no edit.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from types import SimpleNamespace

import pytest
import torch
from helpers import CONFIGS
from omegaconf import OmegaConf

from model import KERNELS, MIXERS, GPTConfig, build_attention
from model.attention import AttentionSpec
from model.attention.options import applied, option_fields, takers
from model.checkpoints.gpt2_export import GPT2_HOLDS, what_gpt2_cannot_hold
from model.config import attention_label

OPTIONS = {f.name: f.metadata for f in fields(AttentionSpec) if f.name in option_fields()}
N_EMBD, N_HEAD, T = 16, 4, 12


def test_every_option_says_a_value_that_sets_it():
    assert OPTIONS, "AttentionSpec has options"
    for name, meta in OPTIONS.items():
        assert "example" in meta, f"AttentionSpec.{name} declares no example (its field's metadata: option(...))"


def layout_defaults(layout: str) -> dict:
    """What the layout's config file sets beside its name (attention=mla: its latent width)."""
    path = CONFIGS / "attention" / f"{layout}.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}
    return {k: v for k, v in values.items() if k != "attention" and v is not None}


def build(layout: str, kernel: str = "sdpa", seed: int = 0, **options):
    """A block of ``layout``, block size 16, with parameters drawn larger than the init's (a change shows)."""
    torch.manual_seed(seed)
    block = build_attention(layout, N_EMBD, N_HEAD, kernel, block_size=16, **options)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return block


def buildable(layout: str, kernel: str, never: str | None = None, **options):
    """The block, retried with what a refusal says it needs (``needs model.rope_head_dim=...``: attention=mla with
    rotary; never the option ``never``: a block that needs it cannot be built with it off), or the ValueError."""
    while True:
        try:
            return build(layout, kernel, **options)
        except ValueError as err:
            needed = [n for n in re.findall(r"needs model\.(\w+)=", str(err))
                      if n in OPTIONS and n not in options and n != never]  # fmt: skip
            if not needed:
                return err
            options = {**options, **{n: OPTIONS[n]["example"] for n in needed}}


def output(block, x: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """The block's output at ``x``: two documents, the second from the middle (what document masking reads; a block
    without it sees one)."""
    torch.manual_seed(seed)  # dropout draws the same masks for both blocks compared
    starts = torch.zeros(x.shape[:2], dtype=torch.long)
    starts[:, x.size(1) // 2 :] = x.size(1) // 2
    with torch.no_grad():
        return block.train()(x, None, None, starts)


def same_weights(target, source) -> None:
    """``target`` takes every parameter of ``source`` of the same name and shape (the option's own keep theirs)."""
    theirs = dict(source.named_parameters())
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name in theirs and theirs[name].shape == p.shape:
                p.copy_(theirs[name])


def computes_something_else(layout: str, kernel: str, name: str, meta: dict, on) -> bool | None:
    """Whether ``on`` (the option set) computes another function than the block with the option off; None where
    the block cannot be built with it off (an option its layer needs: attention=mla's latent)."""
    off = buildable(layout, kernel, never=name, **{**layout_defaults(layout), **meta["with"]})
    if isinstance(off, ValueError):
        return None
    same_weights(on, off)
    x = torch.randn(2, T, N_EMBD, generator=torch.Generator().manual_seed(2))
    return not torch.allclose(output(on, x), output(off, x), atol=1e-6, rtol=1e-5)


def applies(layout: str, options: dict) -> bool:
    """Whether the layer declares it applies the options' last one (with the position encoding they choose)."""
    name = list(options)[-1]
    return name in applied(MIXERS[layout], SimpleNamespace(position=options.get("position", "learned")))


@pytest.mark.parametrize("layout", sorted(MIXERS))
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_is_applied_or_refused_in_every_layer(name, layout):
    meta = OPTIONS[name]
    options = {**layout_defaults(layout), **meta["with"], name: meta["example"]}
    block = buildable(layout, "sdpa", **options)
    if isinstance(block, ValueError):
        message = str(block)
        assert f"model.{name}=" in message or any(f"model.{n}=" in message for n in meta["with"]), message
        if not applies(layout, options):  # refused as not its own: who takes it is named
            assert all(who in message for who in takers(name)) or layout in message, message
        return
    assert applies(layout, options), f"attention={layout} took model.{name}={meta['example']!r}, not declared"
    if meta["same_function"]:
        return
    changed = computes_something_else(layout, "sdpa", name, meta, block)
    assert changed is not False, f"attention={layout} takes model.{name}={meta['example']!r} and ignores it"


@pytest.mark.parametrize("name", sorted(n for n, meta in OPTIONS.items() if meta["with"]))
def test_an_option_without_what_it_needs_is_refused(name):
    """An option that needs another (a rotary scaling needs a factor above 1; YaRN's trained length needs YaRN) is
    refused without it, naming one of them: it would otherwise be accepted and change nothing."""
    meta = OPTIONS[name]
    for need in meta["with"]:
        off = next(f.default for f in fields(AttentionSpec) if f.name == need)
        options = {**meta["with"], name: meta["example"], need: off}
        block = buildable("fused_qkv", "manual", never=need, **options)
        assert isinstance(block, ValueError), f"model.{name}={meta['example']} was taken with model.{need}={off}"
        assert f"model.{name}=" in str(block) or f"model.{need}=" in str(block), str(block)


def kernel_cells():
    """Each option's effects x every kernel; flex's cells but the first are the slow tier's (each compiles graphs of
    its own: 6-9 s on a fresh 2-core machine), so the default tier compiles flex here once."""
    flexed = 0
    for name, meta in sorted(OPTIONS.items()):
        spec = AttentionSpec(N_EMBD, N_HEAD, "manual", block_size=16, **{**meta["with"], name: meta["example"]})
        effects = [effect for effect, _, _ in spec.kernel_effects] + (["dropout"] if spec.dropout else [])
        for effect in effects:
            for kernel in sorted(KERNELS):
                compiles = kernel == "flex" and (flexed := flexed + 1) > 1
                yield pytest.param(name, effect, kernel, id=f"{name}-{effect}-{kernel}",
                                   marks=[pytest.mark.slow] if compiles else [])  # fmt: skip


@pytest.mark.parametrize("name,effect,kernel", list(kernel_cells()))
def test_every_effect_an_option_asks_of_a_kernel_is_applied_or_refused_naming_the_kernel(name, effect, kernel):
    from model.attention.kernels import flex_unavailable

    meta = OPTIONS[name]
    block = buildable("fused_qkv", kernel, **{**meta["with"], name: meta["example"]})
    if effect not in KERNELS[kernel].applies:
        assert isinstance(block, ValueError), f"kernel={kernel} cannot apply {effect}, and took model.{name}"
        # named by the option, or by the one it needs that asks the effect (an indexer's width: its top-k)
        named = any(f"model.{n}=" in str(block) for n in (name, *meta["with"]))
        assert f"kernel={kernel}" in str(block) and named, str(block)
        return
    assert not isinstance(block, ValueError), str(block)
    if kernel == "flex" and flex_unavailable(torch.device("cpu")):
        pytest.skip(flex_unavailable(torch.device("cpu")))
    if kernel == "flex" and effect != "dropout":  # flex on a CPU has no backward: its training-mode forward
        block.eval()
    assert computes_something_else("fused_qkv", kernel, name, meta, block), f"kernel={kernel} ignores {effect}"


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_export_refuses_every_option_gpt2_does_not_hold(name):
    meta = OPTIONS[name]
    fields_of = {**meta["with"], name: meta["example"]}
    try:
        config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=N_HEAD, n_embd=N_EMBD, kernel="manual",
                           **fields_of)  # fmt: skip
    except ValueError:  # a layer's own option (attention=mla's latent): refused for GPT-2's layouts already
        assert name not in applied(MIXERS["fused_qkv"], AttentionSpec(N_EMBD, N_HEAD))
        return
    problems = " ".join(what_gpt2_cannot_hold(config))
    if name in GPT2_HOLDS:
        assert f"model.{name}=" not in problems
    else:
        assert any(f"model.{n}=" in problems for n in fields_of), f"export took model.{name}: {problems!r}"


@pytest.mark.parametrize("name", [n for n, meta in OPTIONS.items() if meta.get("labelled", True)])
def test_every_option_set_changes_the_run_label(name):
    """Two runs that differ in an option must not share a name (run directories, reports, plot legends, wandb
    groups all use the label): set at its example, an option is spelled in ``attention_label``, unless it declares
    that it is not (``labelled=False``: dropout, a training setting)."""
    meta = OPTIONS[name]
    model = {f.name: f.default for f in fields(GPTConfig) if f.default is not MISSING}
    model |= {"attention": "fused_qkv", **meta["with"]}
    plain, labelled = attention_label(model), attention_label({**model, name: meta["example"]})
    assert labelled != plain, f"model.{name}={meta['example']} leaves the run label at {plain}: say it there"

"""Export a headlab GPT of any layout to the Hugging Face GPT-2 format (``config.json`` + ``model.safetensors``).

The inverse of ``model.checkpoints.gpt2_import``: weights converted to the fused layout
(GPT-2's ``c_attn``), matmul weights transposed to ``Conv1D``'s (in, out), the
padded vocabulary cropped, and, for models trained without biases, zero biases
(exactly the same function). ``transformers.GPT2LMHeadModel.from_pretrained``
loads the folder with the same logits.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import torch

from model import registry
from model.attention.options import applied, is_set, option_fields, spelled
from model.attention.spec import AttentionSpec
from model.checkpoints.convert import convert_attention_layout
from model.checkpoints.gpt2_import import CONV1D
from model.gpt import GPT

HF_CONFIG, HF_WEIGHTS = "config.json", "model.safetensors"  # what GPT2LMHeadModel.from_pretrained reads

# GPT-2's activation is the tanh approximation of GELU ("gelu_new" in transformers), as headlab's MLP.
HF_ACTIVATION = "gelu_new"
# The attention options GPT-2's format holds set away from their off values, as each declares (``option(gpt2=True)``):
# grouped key/value heads (written repeated per query head, the same function), keys equal to values (the values
# written as the keys, the same function: GPT-2 holds no encoding that turns keys before they serve as values) and
# dropout (training's, no part of the function). Every other option set is refused: the specific ones with why
# (below), any other, a new one included, as having no place.
GPT2_HOLDS = frozenset(f.name for f in fields(AttentionSpec) if f.metadata.get("gpt2"))


def what_gpt2_cannot_hold(config) -> list[str]:
    """The options of a model (a GPTConfig) that GPT-2's format has no place for, each named with why: in
    GPT-2's format the model would compute another function. Grouped-query heads are not among them: their
    keys and values are written repeated per query head, the same function."""
    if config.layer_pattern is not None:  # each kind's layers as a uniform model: GPT-2's layers are all alike
        names = config.layer_kind_names
        problems = [as_kind_sets_it(problem, kind, config.layer_kinds[kind]) for kind in dict.fromkeys(names)
                    for problem in what_gpt2_cannot_hold(config.layer_config(names.index(kind)))]  # fmt: skip
        return list(dict.fromkeys(problems))
    problems = []
    if config.kv_from is not None:
        problems.append(f"model.kv_from={config.kv_from} (GPT-2's layers each project their own keys and values: "
                        f"none reads another layer's)")  # fmt: skip
    if config.window is not None:
        problems.append(f"model.window={config.window} (GPT-2 has no sliding-window attention: it attends over its "
                        f"whole context)")  # fmt: skip
    if not registry.position(config.position).in_gpt2:
        problems.append(f"model.position={config.position} (GPT-2 holds learned positions only: a table of "
                        f"block_size vectors)")  # fmt: skip
    for mod in registry.MODIFICATIONS.values():  # QK-norm, softcap, sinks (ALiBi: its position encoding's, above)
        problem = mod.gpt2_problem(getattr(config, mod.field))
        if problem:
            problems.append(problem)
    layout, gpt2 = registry.mixer(config.attention), registry.mixer(registry.canonical_layout())  # GPT-2's form
    if getattr(layout, "function", None) != getattr(gpt2, "function", None):
        problems.append(f"attention={config.attention} (it computes {layout.computes}: another function than "
                        f"GPT-2's multi-head attention)")  # fmt: skip
    return problems + unheld(config, layout, gpt2)


def unheld(config, layout, gpt2) -> list[str]:
    """Every other option the model sets that GPT-2's format does not hold (``GPT2_HOLDS``): those that a layer of
    GPT-2's function applies (another function's are its layout's problem, said above), and that no specific
    problem above names (the window, the position encoding and its options, the modifications)."""
    spec = config.attention_spec
    named = {"window", "position", *registry.POSITIONS[config.position].fields,
             *(mod.field for mod in registry.MODIFICATIONS.values())}  # fmt: skip
    ours = applied(gpt2, spec) if layout.function == gpt2.function else set()
    return [f"model.{name}={spelled(getattr(spec, name))} (GPT-2's format has no place for it)"
            for name in option_fields(type(spec))
            if is_set(spec, name) and name not in GPT2_HOLDS | named and name in ours]  # fmt: skip


def as_kind_sets_it(problem: str, kind: str, overrides: dict) -> str:
    """A layer kind's problem named where it is set: ``model.layer_kinds.L.window=4 (...)`` for a field the kind
    sets, ``model.window=4 (...)`` for one it takes from the model."""
    option = problem.removeprefix("model.")
    if option.split("=")[0] not in overrides:
        return problem
    return f"model.layer_kinds.{kind}.{option}"


def check_gpt2_holds(config) -> None:
    """Refuse, before anything is written, a model GPT-2's format cannot hold, naming each option and the fix."""
    problems = what_gpt2_cannot_hold(config)
    if problems:
        gpt2 = getattr(registry.mixer(registry.canonical_layout()), "function", None)
        layouts = ", ".join(name for name, cls in registry.MIXERS.items()
                            if getattr(cls, "function", None) == gpt2)  # fmt: skip
        raise ValueError(f"GPT-2's format cannot hold this model: {'; '.join(problems)}. Export a model trained "
                         f"with GPT-2's attention (learned positions, none of the options above; layout "
                         f"{layouts}, grouped-query heads too); this checkpoint itself loads in sample.py and "
                         f"evaluate.py as it is")  # fmt: skip


def gpt2_form(config):
    """The model as GPT-2's format holds it: every layer alike, multi-head, in the fused layout. A schedule's
    kinds that GPT-2 holds differ only in their key/value heads (``what_gpt2_cannot_hold`` refuses the rest),
    which the conversion writes repeated per query head, so one uniform model of layer 0's fields is each
    layer's."""
    return replace(config.layer_config(0), attention="fused_qkv", kernel="sdpa", sdpa_backend="auto",
                   n_kv_head=None, k_eq_v=False)  # fmt: skip


def repeated_heads(config) -> list[str]:
    """The key/value heads GPT-2's format writes repeated to ``n_head``, each count that is fewer as the export
    says it: ``1`` (the model's), or ``layer kind L's 1`` for each kind of a schedule."""
    if config.layer_pattern is None:
        return [str(config.kv_heads)] if config.kv_heads != config.n_head else []
    names = config.layer_kind_names
    heads = {kind: config.layer_config(names.index(kind)).kv_heads for kind in dict.fromkeys(names)}
    return [f"layer kind {kind}'s {n}" for kind, n in heads.items() if n != config.n_head]


def hf_gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights named and shaped as ``GPT2LMHeadModel``'s (the LM head is tied, so left out)."""
    config = model.config
    check_gpt2_holds(config)
    # Any layout -> the fused c_attn GPT-2 uses; grouped-query keys and values repeated for every query
    # head of their group, in each layer as it has them: GPT-2's multi-head form of the same function.
    fused = GPT(gpt2_form(config))
    fused.load_weights(convert_attention_layout(model.state_dict(), config.attention, "fused_qkv", config.n_head,
                                                as_multi_head=True))  # fmt: skip
    out: dict[str, torch.Tensor] = {}
    for key, tensor in fused.state_dict().items():
        if key == "lm_head.weight":
            continue
        if key.endswith(CONV1D):
            tensor = tensor.t()
        if key == "transformer.wte.weight":
            tensor = tensor[: config.vocab_size]  # crop the padding rows
        out[key] = tensor.detach().to(torch.float32).contiguous().clone()
    if not config.bias:  # GPT-2 always has biases: zeros compute the same function
        for key in list(out):
            if key.endswith(".weight") and (key.rsplit(".", 2)[-2].startswith(("ln_", "c_"))):
                bias = key[: -len("weight")] + "bias"
                width = out[key].shape[-1] if key.endswith(CONV1D) else out[key].shape[0]
                out.setdefault(bias, torch.zeros(width))
    return out


def hf_gpt2_config(model: GPT, eot_id: int | None) -> dict:
    c = model.config
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,  # 4 * n_embd, as headlab's MLP
        "activation_function": HF_ACTIVATION,
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout,
        "layer_norm_epsilon": 1e-5,  # torch.nn.LayerNorm's default, which headlab uses
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


def export_hf_gpt2(model: GPT, folder: Path, eot_id: int | None) -> list[Path]:
    """Write ``config.json`` and ``model.safetensors`` (``HF_CONFIG``, ``HF_WEIGHTS``) into ``folder``; returns
    the files written."""
    from safetensors.torch import save_file

    check_gpt2_holds(model.config)  # before the folder is made
    folder.mkdir(parents=True, exist_ok=True)
    save_file(hf_gpt2_state_dict(model), str(folder / HF_WEIGHTS), metadata={"format": "pt"})
    (folder / HF_CONFIG).write_text(json.dumps(hf_gpt2_config(model, eot_id), indent=2) + "\n")
    return [folder / HF_CONFIG, folder / HF_WEIGHTS]

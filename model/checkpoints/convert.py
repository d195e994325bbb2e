"""Exact weight conversion between attention layouts.

Each layout (``model.attention``) says how its q/k/v parameters map to and from
one common form, the full-width q, k and v matrices; converting is then one
generic loop: find each attention module's q/k/v tensors, read them in the
source layout's form, write them in the destination's. Biases follow their
weights; ``c_proj`` and everything else passes through untouched. A conversion
is a pure re-arrangement, so it works on parameters and gradients alike.

Only layouts of one function convert (``MultiHeadAttention.function``): attention=mla computes another
(keys and values through a latent), and converting to or from it is refused, naming why.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from model import registry
from model.attention.layouts import kv_heads_of
from model.attention.pipeline import QKV, MultiHeadAttention
from model.registry import MIXERS, weight_name_start


def split_qkv_key(key: str) -> tuple[str, str, str] | None:
    """(layout, module prefix, name inside the module) of a q/k/v tensor's key, or None for other keys: the layer
    whose pattern matches earliest in the key (the wrapper's ``heads.0.query`` before separate_qkv's ``query``), so
    the order layers registered in says nothing."""
    found = [(start, name) for name, cls in MIXERS.items()
             if (start := weight_name_start(cls, key)) is not None]  # fmt: skip
    if not found:
        return None
    start, layout = min(found)
    return layout, key[:start], key[start:]


def detect_attention_layout(state_dict: Mapping[str, torch.Tensor], like: str | None = None) -> str:
    """The layout whose q/k/v parameter names a state dict uses. A hybrid's holds layouts of two functions (its
    linear layers'): there, the one of ``like``'s function."""
    found = {parts[0] for key in state_dict if (parts := split_qkv_key(key))}
    if like is not None and len(found) > 1:
        function = registry.mixer(like).function
        found = {name for name in found if registry.mixer(name).function == function} or found
    if not found:
        examples = [repr(cls.QKV_EXAMPLE) for cls in MIXERS.values()]
        raise ValueError(
            "the state dict holds no attention q/k/v weights "
            f"(no {', '.join(examples[:-1])} or {examples[-1]} keys); is it a headlab GPT state dict?"
        )
    functions = {registry.mixer(name).function for name in found}
    if len(found) > len(functions):
        raise ValueError(f"the state dict mixes attention layouts {sorted(found)}; it is corrupt")
    if len(found) > 1:
        raise ValueError(f"the state dict holds layers of {' and '.join(sorted(found))}: a hybrid; say which "
                         f"function's layout to read")  # fmt: skip
    return found.pop()


def convert_attention_layout(
    state_dict: Mapping[str, torch.Tensor], src: str, dst: str, n_head: int | None = None,
    as_multi_head: bool = False,
) -> dict[str, torch.Tensor]:
    """Turn a state dict (GPT or single attention block) from layout ``src`` into ``dst``.

    ``n_head`` is needed only to split heads when converting *to* a layout of single heads (the wrapper)
    from one whose parameters do not say how many heads they have (``heads_in``: a wrapper's do).
    ``as_multi_head`` writes grouped-query keys and values as the multi-head equivalent: each
    key/value head repeated for every query head of its group, and keys equal to values (model.k_eq_v) with the
    keys written as the values too (the same function; e.g. for GPT-2).
    """
    src_cls, dst_cls = registry.mixer(src), registry.mixer(dst)
    check_converts(src, dst)
    seen = detect_attention_layout(state_dict, like=src)
    if seen != src:
        raise ValueError(f"the state dict holds {seen!r} attention weights, not src={src!r}")

    out: dict[str, torch.Tensor] = {}
    modules: dict[str, dict[str, torch.Tensor]] = {}  # module prefix -> its q/k/v tensors by local name
    for key, tensor in state_dict.items():
        parts = split_qkv_key(key)
        if parts is None or registry.mixer(parts[0]).function != src_cls.function:  # a hybrid's other layers
            out[key] = tensor
        else:
            modules.setdefault(parts[1], {})[parts[2]] = tensor

    for prefix, params in modules.items():
        heads = src_cls.heads_in(params)
        if heads is None:
            heads = n_head
        elif n_head is not None and heads != n_head:
            raise ValueError(f"the {src} state dict has {heads} heads, but n_head={n_head} was given")
        try:
            qkv = src_cls.to_qkv(params, heads)
            if as_multi_head:
                qkv = repeated_kv(qkv, heads)
            local = dst_cls.from_qkv(qkv, heads)
        except ValueError as err:
            raise ValueError(f"attention {prefix!r}: {err}") from None
        out.update({prefix + name: tensor for name, tensor in local.items()})
    return out


def check_converts(src: str, dst: str) -> None:
    """Refuse, in one line, converting between layouts that compute different functions (attention=mla and the
    three QKV layouts): before any weights are read or a model is built."""
    src_cls, dst_cls = registry.mixer(src), registry.mixer(dst)
    if src_cls.function != dst_cls.function:
        odd, other = (src_cls, dst_cls) if src_cls.function != MultiHeadAttention.function else (dst_cls, src_cls)
        raise ValueError(function_refusal(odd, other.name))


def function_refusal(odd: type, other: str) -> str:
    """Why layout ``odd``, which computes another function than ``other``, does not convert to or from it."""
    return (f"attention={odd.name} computes another function ({odd.computes}), so its weights do not convert "
            f"to/from {other}; train it, or init_from a checkpoint of attention={odd.name}")  # fmt: skip


class ConvertsToNoOther:
    """Mixed into a layout of a function of its own (attention=mla, gated_deltanet): its weights convert to no
    other layout, refused naming why."""

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        raise ValueError(function_refusal(cls, "the other layouts"))

    @classmethod
    def from_qkv(cls, qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        raise ValueError(function_refusal(cls, "the other layouts"))


def same_function_layouts(layout: str) -> list[str]:
    """The layouts that compute the same function as ``layout`` (itself included), sorted: those its weights
    convert to exactly (attention=mla computes another function than fused_qkv, separate_qkv and wrapper)."""
    function = registry.mixer(layout).function
    return sorted(name for name, cls in MIXERS.items() if cls.function == function)


def initial_form(layout: str) -> str:
    """The layout a model of ``layout`` draws its initial weights in (``GPT.reset_parameters``): the canonical
    one, then converted, so that every layout of a function starts from the same weights for a seed; a layout
    of another function draws in its own form."""
    canonical = registry.canonical_layout()
    return canonical if canonical in same_function_layouts(layout) else layout


def repeated_kv(qkv: QKV, n_head: int | None) -> QKV:
    """The common form with each key/value head repeated for the query heads of its group (multi-head); values that
    are the keys (None: model.k_eq_v) written as a copy of them."""
    if n_head is None:
        raise ValueError("repeating key/value heads needs n_head=<number of query heads>")
    group = n_head // kv_heads_of(qkv, n_head)
    out = {}
    for kind, (q, k, v) in qkv.items():
        head_dim = q.size(0) // n_head
        out[kind] = (q, *(t.unflatten(0, (-1, head_dim)).repeat_interleave(group, dim=0).flatten(0, 1)
                          for t in (k, k if v is None else v)))  # fmt: skip
    return out

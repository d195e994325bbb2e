"""Exact weight conversion between attention layouts, and GPT-2 import.

The three layouts hold the same numbers arranged differently:

- ``separate_qkv``: ``query.weight`` (C, C), ``key.weight``, ``value.weight``;
- ``fused_qkv``: ``c_attn.weight`` (3C, C) = [query; key; value] stacked by rows;
- ``wrapper``: ``heads.{h}.query.weight`` (C/H, C) = rows h*C/H ... (h+1)*C/H of
  the full query matrix (likewise key and value).

Biases follow their weights. ``c_proj`` and everything else is shared and
passes through untouched, so a conversion is a pure re-arrangement: it works
on parameters and on their gradients alike.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

import torch

from model.attention import ATTENTION_LAYOUTS
from model.registry import lookup

# One q/k/v tensor of some layout. The lazy prefix makes ``heads.N.query`` win
# over a bare ``query`` when both could match.
_QKV_KEY = re.compile(
    r"^(?P<module>(?:.*?\.)??)"
    r"(?:heads\.(?P<head>\d+)\.(?P<head_proj>query|key|value)"
    r"|(?P<proj>query|key|value)"
    r"|(?P<fused>c_attn))"
    r"\.(?P<kind>weight|bias)$"
)
_PROJECTIONS = ("query", "key", "value")


def _layout_of_match(match: re.Match) -> str:
    if match["head"] is not None:
        return "wrapper"
    return "fused_qkv" if match["fused"] else "separate_qkv"


def detect_attention_layout(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The layout whose q/k/v parameter names a state dict uses."""
    found = {_layout_of_match(m) for key in state_dict if (m := _QKV_KEY.match(key))}
    if not found:
        raise ValueError(
            "the state dict holds no attention q/k/v weights "
            "(no 'heads.N.query', 'query' or 'c_attn' keys); is it a headlab GPT state dict?"
        )
    if len(found) > 1:
        raise ValueError(f"the state dict mixes attention layouts {sorted(found)}; it is corrupt")
    return found.pop()


def convert_attention_layout(
    state_dict: Mapping[str, torch.Tensor], src: str, dst: str, n_head: int | None = None
) -> dict[str, torch.Tensor]:
    """Turn a state dict (GPT or single attention block) from layout ``src`` into ``dst``.

    ``n_head`` is needed only to split heads when converting *to* ``wrapper``
    from another layout (a wrapper state dict already says how many heads it has).
    """
    for name in (src, dst):
        lookup(ATTENTION_LAYOUTS, "attention layout", name)
    seen = detect_attention_layout(state_dict)
    if seen != src:
        raise ValueError(f"the state dict holds {seen!r} attention weights, not src={src!r}")

    out: dict[str, torch.Tensor] = {}
    # module prefix -> kind (weight/bias) -> projection -> [tensor or per-head tensors]
    groups: dict[str, dict[str, dict]] = defaultdict(lambda: defaultdict(dict))
    for key, tensor in state_dict.items():
        match = _QKV_KEY.match(key)
        if match is None:
            out[key] = tensor
        elif src == "wrapper":
            heads = groups[match["module"]][match["kind"]].setdefault(match["head_proj"], {})
            heads[int(match["head"])] = tensor
        elif src == "separate_qkv":
            groups[match["module"]][match["kind"]][match["proj"]] = tensor
        else:
            for proj, part in zip(_PROJECTIONS, tensor.chunk(3, dim=0)):
                groups[match["module"]][match["kind"]][proj] = part

    for module, kinds in groups.items():
        for kind, projections in kinds.items():
            missing = [p for p in _PROJECTIONS if p not in projections]
            if missing:
                raise ValueError(f"attention {module!r} has no {missing} {kind}; the state dict is incomplete")
            heads = n_head
            if src == "wrapper":
                heads = len(projections["query"])
                if n_head is not None and heads != n_head:
                    raise ValueError(f"the wrapper state dict has {heads} heads, but n_head={n_head} was given")
                projections = {
                    p: _join_heads(per_head, f"{module}heads.*.{p}.{kind}") for p, per_head in projections.items()
                }
            out.update(_emit(module, kind, projections, dst, heads))
    return out


def _join_heads(heads: dict[int, torch.Tensor], what: str) -> torch.Tensor:
    if sorted(heads) != list(range(len(heads))):
        raise ValueError(f"{what}: head indices {sorted(heads)} are not 0..{len(heads) - 1}")
    return torch.cat([heads[h] for h in range(len(heads))], dim=0)


def _emit(
    module: str, kind: str, qkv: dict[str, torch.Tensor], dst: str, n_head: int | None
) -> dict[str, torch.Tensor]:
    if dst == "fused_qkv":
        return {f"{module}c_attn.{kind}": torch.cat([qkv[p] for p in _PROJECTIONS], dim=0)}
    if dst == "separate_qkv":
        return {f"{module}{p}.{kind}": qkv[p].clone() for p in _PROJECTIONS}
    if n_head is None:
        raise ValueError("converting to 'wrapper' needs n_head=<number of heads> to split the heads")
    width = qkv["query"].size(0)
    if width % n_head != 0:
        raise ValueError(f"attention width {width} is not divisible by n_head={n_head}")
    return {
        f"{module}heads.{h}.{p}.{kind}": part.clone()
        for p in _PROJECTIONS
        for h, part in enumerate(qkv[p].chunk(n_head, dim=0))
    }

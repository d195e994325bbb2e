"""Score modifications: what a model does to the attention scores between Q K^T / sqrt(d) and the softmax,
to the queries and keys before them (QK-norm), and to the heads' outputs after them (the output gate).

Each is a class registered in ``model.registry.SCORE_MODS`` that states its own facts: its config field, its
part of a run's label, its report column, its ``bench.py`` flag, whether GPT-2's format holds it, its
parameters and their initial values, its plan memory term; the config checks, run names, reports, plots,
``bench.py``, the export and the plan iterate the registry. Its float64 reference is
``tests/attention_reference.py``'s (the tests refuse a registered modification without one).

- ``alibi`` (``model.position=alibi``): head h adds -slope_h x (query position - key position);
- ``qk_norm`` (``model.qk_norm=true``, Qwen3, OLMo 2): RMSNorm of each head's queries and keys, learned scales;
- ``softcap`` (``model.softcap=c``, Gemma 2): scores become c x tanh(scores / c), before the bias and mask;
- ``sinks`` (``model.sinks=true``, gpt-oss): a learned logit per head joins the softmax's denominator and
  attends to nothing: a head may put weight on "no key" instead of being forced to spread it.
- ``gate`` (``model.gate=headwise|elementwise``, Qwen3-Next's, arXiv 2505.06708): the heads' outputs times
  sigmoid(x W_g), x the block's input, one gate per head or per element, before the output projection.

In that order: softcap(scores) + ALiBi bias, then the causal (and window) mask, then the softmax over the
keys and the sink. ``ScoreMods`` carries a block's values to its kernel; the kernels apply them in their
own way (the manual kernel literally, sdpa through a float mask, flex through a score_mod), and the
property tests hold every kernel to the float64 formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from model import registry
from model.registry import SCORE_MODS, register


def finite_number(value) -> bool:
    """A real number a formula can use: not a bool, a string, NaN or an infinity (YAML reads 1e400 as inf)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def spelled(value) -> str:
    """A value as an override types it, for refusals: ``null``, ``true``, ``30.0``, ``headwise``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


class ScoreMod:
    """A modification of the attention, as a model's config sets it: a switch (``model.<field>=true``) unless a
    subclass says otherwise. Every fact is asked of the class; nothing else spells its name."""

    name: ClassVar[str]
    field: ClassVar[str]  # the GPTConfig (and AttentionSpec) field that sets it
    off: ClassVar = False  # the field's value when unused (its default)
    example: ClassVar = True  # a value that uses it (for docs and tests)
    on_scores: ClassVar[bool] = True  # acts between the scores and the softmax: a kernel must say it applies it
    column: ClassVar[str | None] = None  # its report column's title; None: another axis shows it
    label_pattern: ClassVar[str | None] = None  # its part of a run's label as a pattern, and as a legend spells it
    label_title: ClassVar[str | None] = None
    bench_help: ClassVar[str | None] = None  # help of its bench.py flag (--<field>); None: no flag of its own
    bench_off: ClassVar[str] = "off"  # the flag's value that leaves it unused (its default)
    gpt2_lacks: ClassVar[str | None] = None  # why GPT-2's format cannot hold it, for the export; None: it can

    @classmethod
    def used(cls, value) -> bool:
        """Whether a model with ``value`` in its field uses the modification."""
        return bool(value)

    @classmethod
    def row_value(cls, value):
        """Its value in a report's row (``analysis/report.py``): a switch's on/off."""
        return bool(value)

    @classmethod
    def check(cls, value) -> None:
        """Refuse a value the field cannot take, in one line naming it."""
        if not isinstance(value, bool):
            raise ValueError(f"model.{cls.field}={value!r} must be true or false")

    @classmethod
    def option(cls, value) -> str:
        """How a user sets it, for errors: ``model.sinks=true``."""
        return f"model.{cls.field}=true"

    @classmethod
    def label(cls, value) -> str | None:
        """Its part of a run's label (``attention_label``), or None when unused or another part says it."""
        return cls.name if cls.used(value) else None

    @classmethod
    def gpt2_problem(cls, value) -> str | None:
        """Why GPT-2's format cannot hold a model that uses it, or None."""
        if cls.gpt2_lacks is None or not cls.used(value):
            return None
        return f"{cls.option(value)} ({cls.gpt2_lacks})"

    @classmethod
    def parameters(cls, n_head: int) -> dict[str, float]:
        """The (n_head,) parameters it adds to an attention block, by name, and the value each starts at."""
        return {}

    @classmethod
    def initial_values(cls, n_head: int) -> dict[str, float]:
        """The value each parameter it owns starts at (``GPT.reset_parameters``), by its name's ending."""
        return cls.parameters(n_head)

    @classmethod
    def plan_bytes(cls, elements: int, kv_share: float) -> float:
        """Bytes autograd keeps for it per layer in one forward (``training/plan.py``), for queries of
        ``elements`` elements and keys and values ``kv_share`` of that; 0 for most."""
        return 0

    @classmethod
    def bench_value(cls, text: str):
        """A value of its bench.py flag: ``on`` / ``off`` (ValueError: the one-line reason)."""
        switches = {"off": False, "on": True, "false": False, "true": True}
        if text.lower() not in switches:
            raise ValueError(f"--{cls.flag()} {text}: give off and/or on")
        return switches[text.lower()]

    @classmethod
    def flag(cls) -> str:
        """Its bench.py flag without the dashes: the field, dashed (``qk-norm``)."""
        return cls.field.replace("_", "-")


@register(SCORE_MODS)
class Alibi(ScoreMod):
    """ALiBi (Press et al. 2022): a position encoding that biases the scores, so it is set, named, shown, benched
    and refused for GPT-2 as ``model.position`` (the position encoding's own facts)."""

    name, field, off, example = "alibi", "position", "learned", "alibi"

    @classmethod
    def used(cls, value) -> bool:
        return registry.position(value).biases_scores

    @classmethod
    def check(cls, value) -> None:
        registry.position(value)

    @classmethod
    def option(cls, value) -> str:
        return f"model.position={value}"

    @classmethod
    def label(cls, value) -> str | None:
        return None  # the position's part of the label says it


@register(SCORE_MODS)
class QKNorm(ScoreMod):
    """QK-norm (Qwen3's, OLMo 2's): queries and keys RMS-normalised per head, one learned scale per head dim."""

    name, field, on_scores, column = "qk_norm", "qk_norm", False, "qk norm"
    label_pattern, label_title = r"qknorm", "-qknorm"
    bench_help, gpt2_lacks = "QK-norm (model.qk_norm): off and/or on", "GPT-2 has no norm of the queries and keys"

    @classmethod
    def label(cls, value) -> str | None:
        return "qknorm" if value else None

    @classmethod
    def initial_values(cls, n_head: int) -> dict[str, float]:
        return {"q_norm.weight": 1.0, "k_norm.weight": 1.0}

    @classmethod
    def plan_bytes(cls, elements: int, kv_share: float) -> float:
        return 2.75 * ((1 + kv_share) * elements) * 4  # RMSNorm's float32 steps: about 2.75 copies, measured


@register(SCORE_MODS)
class Softcap(ScoreMod):
    """Gemma 2's logit softcap: scores -> c tanh(scores / c)."""

    name, field, off, example, column, bench_off = "softcap", "softcap", None, 30.0, "softcap", "none"
    label_pattern, label_title = r"softcap[\d.e+]+", "-softcap<cap>"
    bench_help, gpt2_lacks = "score caps (model.softcap): numbers, or none", "GPT-2 does not cap its scores"

    @classmethod
    def used(cls, value) -> bool:
        return value is not None

    @classmethod
    def row_value(cls, value):
        return value

    @classmethod
    def check(cls, value) -> None:
        if value is not None and (not finite_number(value) or not value > 0):
            raise ValueError(f"model.softcap={value!r} must be a finite positive number (Gemma 2 caps at 50), or "
                             f"null (none)")  # fmt: skip

    @classmethod
    def option(cls, value) -> str:
        return f"model.softcap={value}"

    @classmethod
    def label(cls, value) -> str | None:
        if value is None:
            return None
        return f"softcap{value:g}" if finite_number(value) else f"softcap{value}"  # a bad value, named as given

    @classmethod
    def bench_value(cls, text: str):
        if text.lower() == "none":
            return None
        try:
            cap = float(text)
        except ValueError:
            cap = -1.0
        if not cap > 0:
            raise ValueError(f"--softcap {text}: give a positive number (Gemma 2 caps at 50), or none")
        return cap


@register(SCORE_MODS)
class Sinks(ScoreMod):
    """gpt-oss's attention sinks: a learned logit per head in the softmax's denominator, attending to nothing."""

    name, field, column = "sinks", "sinks", "sinks"
    label_pattern, label_title = r"sinks", "-sinks"
    bench_help, gpt2_lacks = "attention sinks (model.sinks): off and/or on", "GPT-2's softmax has no sink"

    @classmethod
    def parameters(cls, n_head: int) -> dict[str, float]:
        return {"sinks": 0.0}


GATES = ("none", "headwise", "elementwise")


@register(SCORE_MODS)
class Gate(ScoreMod):
    """The output gate (Qiu et al. 2025, arXiv 2505.06708; Qwen3-Next): each head's output scaled by a sigmoid of
    a projection of the block's input, one gate per head (``headwise``) or per element (``elementwise``)."""

    name, field, off, example, on_scores, column = "gate", "gate", "none", "elementwise", False, "gate"
    bench_off = "none"
    label_pattern, label_title = r"(?:head|elem)gate", "-headgate|-elemgate"
    bench_help = "output gates (model.gate): none, headwise and/or elementwise"
    gpt2_lacks = "GPT-2 has no gate on the attention output"

    @classmethod
    def used(cls, value) -> bool:
        return value != "none"

    @classmethod
    def row_value(cls, value):
        return value

    @classmethod
    def check(cls, value) -> None:
        if value not in GATES:
            raise ValueError(f"model.gate={value!r}; choose one of: {', '.join(GATES)} (a sigmoid gate on each "
                             f"head's output from the block's input: one per head, or one per element)")  # fmt: skip

    @classmethod
    def option(cls, value) -> str:
        return f"model.gate={value}"

    @classmethod
    def label(cls, value) -> str | None:
        return {"headwise": "headgate", "elementwise": "elemgate"}.get(value) if isinstance(value, str) else None

    @classmethod
    def plan_bytes(cls, elements: int, kv_share: float) -> float:
        return 2 * elements * 4  # the gate's sigmoid and the heads' output it scales, kept for backward (at most)

    @classmethod
    def bench_value(cls, text: str):
        if text not in GATES:
            raise ValueError(f"--gate {text}: give {', '.join(GATES)}")
        return text


def with_fields() -> list[type[ScoreMod]]:
    """The modifications that have a config field and report column of their own (ALiBi's are the position
    encoding's), in the registry's order."""
    return [mod for mod in SCORE_MODS.values() if mod.column is not None]


def score_mod_fields() -> tuple[str, ...]:
    """The config fields of the modifications that have their own (``with_fields``)."""
    return tuple(mod.field for mod in with_fields())


def on_scores() -> tuple[str, ...]:
    """The modifications that act between the scores and the softmax, by name: what a kernel may apply."""
    return tuple(name for name, mod in SCORE_MODS.items() if mod.on_scores)


@dataclass(frozen=True)
class ScoreMods:
    """One attention block's score modifications, for its query heads (a wrapper head gets its own slice). They act
    on the scores of queries and keys at their absolute positions (the kernels pass both: keys in position order, or
    at the positions a wrapped ring or a static step's cache holds them)."""

    slopes: torch.Tensor | None = None  # (H,) ALiBi
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # (H,) learned logits
    # What the slopes' values are a function of (an attention block's head count; a wrapper head's index too),
    # so that the kernels build one bias per forward for all layers alike; None: unknown, built per call.
    slopes_key: tuple | None = None

    @property
    def needs_float_mask(self) -> bool:
        """Whether sdpa takes them through its float mask: any of them (sdpa refuses what a float mask cannot hold,
        softcap, before any work: ``AttentionKernel.applies``)."""
        return self.slopes is not None or self.sinks is not None or self.softcap is not None

    def head(self, h: int) -> ScoreMods:
        """The modifications of query head ``h`` alone (a head axis of size 1)."""
        one = slice(h, h + 1)
        return replace(self, slopes=None if self.slopes is None else self.slopes[one],
                       sinks=None if self.sinks is None else self.sinks[one],
                       slopes_key=None if self.slopes_key is None else (*self.slopes_key, h))  # fmt: skip

    def bias(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """(H, q_len, k_len) ALiBi's -slope x (query position - key position), or None without ALiBi."""
        if self.slopes is None:
            return None
        return -self.slopes.float()[:, None, None] * (queries[:, None] - keys[None, :]).float()

    def modify(self, scores: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(B, H, q_len, k_len) scaled scores of queries and keys at these positions -> capped and biased (before
        the mask)."""
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        bias = self.bias(queries, keys)
        return scores if bias is None else scores + bias.to(scores.dtype)

    def sink_logits(self, like: torch.Tensor) -> torch.Tensor:
        """The sinks as a (B, H, q_len, 1) column beside scores shaped like ``like``."""
        B, H, T, _ = like.shape
        return self.sinks.to(like.dtype).view(1, H, 1, 1).expand(B, H, T, 1)


def softmax_with_sinks(scores: torch.Tensor, mods: ScoreMods | None) -> torch.Tensor:
    """softmax over the keys, with each head's sink in the denominator when there are sinks (its own weight,
    the weight given to no key, is dropped: the rows then sum to less than 1)."""
    if mods is None or mods.sinks is None:
        return torch.softmax(scores, dim=-1)
    return torch.softmax(torch.cat((scores, mods.sink_logits(scores)), dim=-1), dim=-1)[..., :-1]

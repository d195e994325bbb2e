"""The key selection stage's registry: a choice, beyond the masks, of the keys each query attends (DeepSeek's sparse
attention, ``model.attention.sparse``; MoBA's blocks, ``model.attention.blocks``; NSA's, ``model.attention.nsa``).

A selection is one class in its own module, registered by ``@register(SELECTIONS)`` and subclassing ``KeySelection``;
the pipeline (``model.attention.pipeline``) asks the registry, so a new selection edits no other module but its
options' declarations (``AttentionSpec``: ``option(stage="key selection", exclusive="key selection", plan=...)``).
It states:

- ``name``; ``field``, the option that turns it on (set: away from None), and ``attribute``, the block's attribute the
  built selection is held as (its parameters' names in a state dict: ``attn.indexer.wq.weight``);
- ``per_call``: whether it chooses from each kernel call's queries and keys, per query head, after the encodings
  (``select_heads``: MoBA's), or from the block's input, once for every head, before the projection
  (``select_input``: DeepSeek's indexer, which may learn there, from the layer's own attention weights);
- ``build(spec, rotary_width, widths)``: what a block holds (an ``nn.Module`` where it has parameters; drawn apart
  from the dense model's weights, so the rest starts as the model without it does), ``widths`` the layer's score and
  value matmuls' (``score_widths``, over all query heads: MLA's keys are wider than its values);
- its plan terms, with no default, so none is inherited: ``attended(spec, keys)``, the keys a query attends at most of
  the ``keys`` it sees (the score and value matmuls' FLOPs scale with it), and ``flops(spec, keys, widths)``, its own
  scores' training FLOPs per token; with defaults of 0, ``cache_width(spec)`` (numbers per token its cache slot
  keeps) and ``plan_bytes(spec, batch, length, dtype_bytes)`` (activations kept for backward, the plan's
  ``plan_part``);
- ``check(spec)``: its options' one-line refusals; ``does``: what it asks of the kernel, in a refusal's words;
- ``attends``: whether it does more than choose keys for the one kernel call (NSA adds three gated attentions, one of
  them over compressed keys; DeepSeek-V4's compressed attention one softmax over keys and compressed entries): the
  block then calls its ``attend`` in place of its kernel call, its ``weights`` for the attention maps, and, where it
  names ``branches``, its ``branch_gates(x)`` once per forward (``attend`` then gets each call's gates, else None).
  False for a selection that only masks (the rule). A built selection of branches runs one of them alone while
  ``alone`` names it (its gate 1, the others' 0): the pair walk (tests/test_option_pairs.py) holds every option it
  takes to change each branch, so an option applied in some branches and not in the others (a sink in the kernel's
  softmax but not in the compressed one) fails there.

The kernels take a selection as a mask over the keys, ``selected`` (B, 1 or heads, T, S): the ``sparse`` effect of
``AttentionKernel.applies``. Two selections cannot coexist: their options declare the one job (``exclusive``), and the
pair walk (tests/test_option_pairs.py) holds them to a declared conflict.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from model.registry import SELECTIONS


class KeySelection:
    """A registered selection's facts (see the module's docstring); a built one is what a block holds."""

    name: ClassVar[str]
    field: ClassVar[str]
    attribute: ClassVar[str]
    per_call: ClassVar[bool]
    does: ClassVar[str] = "selects the keys each query attends"
    attends: ClassVar[bool] = False
    branches: ClassVar[tuple[str, ...]] = ()  # an attending selection's branches, in its gates' order
    alone: str | None = None  # a built one's branch that runs alone (the pair walk's probe); None: every branch
    plan_part: ClassVar[str] = ""

    @classmethod
    def check_registration(cls, registry: dict[str, type]) -> None:
        """Refused as it registers: a plan term or a selection taken from the base (a selection priced as dense
        attention, or one the pipeline never calls), or a block attribute another selection holds."""
        own = ("attended", "flops", "build", "select_heads" if cls.per_call else "select_input")
        for name in own:
            if next(c for c in cls.__mro__ if name in vars(c)) is KeySelection:
                raise ValueError(f"key selection {cls.name} states no {name} of its own: its plan terms and its choice "
                                 f"are its own; define {name} in its class")  # fmt: skip
        taken = [other.name for other in registry.values() if other.attribute == cls.attribute]
        if taken:
            raise ValueError(f"key selection {cls.name}'s block attribute {cls.attribute!r} is {taken[0]}'s; name it "
                             f"otherwise")  # fmt: skip

    @classmethod
    def used(cls, spec) -> bool:
        return getattr(spec, cls.field, None) is not None

    @classmethod
    def option(cls, spec) -> str:
        return f"model.{cls.field}={getattr(spec, cls.field)}"

    @classmethod
    def check(cls, spec) -> None:
        """Refuse its options' values that cannot build, in one line naming the value and the fix."""

    @classmethod
    def build(cls, spec, rotary_width: int | None, widths: tuple[int, int]):
        raise NotImplementedError

    @classmethod
    def attended(cls, spec, keys: int) -> int:
        raise NotImplementedError

    @classmethod
    def flops(cls, spec, keys: int, widths: tuple[int, int]) -> int:
        raise NotImplementedError

    @classmethod
    def cache_width(cls, spec) -> int:
        return 0

    @classmethod
    def plan_bytes(cls, spec, batch: int, length: int, dtype_bytes: int) -> int:
        return 0

    def select_input(self, block, x: torch.Tensor, positions: torch.Tensor | None, cache,
                     documents: torch.Tensor | None) -> torch.Tensor | None:  # fmt: skip
        """(B, 1, T, S) True where each query attends each key, from the block's input ``x``; None: every key seen."""
        raise NotImplementedError

    def select_heads(self, q: torch.Tensor, k: torch.Tensor, keys, positions: torch.Tensor | None,
                     documents: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """(B, h, T, S) True where each query head attends each key, from a kernel call's queries (B, h, T, d) and each
        query head's keys (B, h, S, d), held at the positions ``keys`` gives (else in order from 0)."""
        raise NotImplementedError


def selection_of(spec) -> type[KeySelection] | None:
    """The registered selection ``spec`` sets, or None (dense attention within the masks). At most one: two selections
    declare their conflict, refused as the spec is made."""
    return next((cls for cls in SELECTIONS.values() if cls.used(spec)), None)

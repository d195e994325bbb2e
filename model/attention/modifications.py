"""The modifications of softmax attention, each at its stage of the pipeline (``Modification.stage``): on the scores
between Q K^T / sqrt(d) and the softmax (the kernel's: ALiBi's bias, softcap, sinks, the forget gate), on the
queries and keys before them (the heads' encodings: QK-norm), and on the heads' outputs after them (the output gate).

Each is a class registered in ``model.registry.MODIFICATIONS`` that states its own facts: its stage, its config field,
its part of a run's label, its report column, its ``bench.py`` flag, whether GPT-2's format holds it, its
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
- ``forget_gate`` (``model.forget_gate=true``, the Forgetting Transformer, arXiv 2503.02130): each token t forgets by
  f_t = sigmoid(x_t w_f + b_f) per head; a query at i weighs the key at j by the forgets after it, adding
  sum_{j < l <= i} log f_l to its score (a bias from the tokens: each key's log f is kept in the KV cache).
- ``path`` (``model.position=path``, PaTH, arXiv 2505.16381): the position encoding's projections, each token's
  direction w_t (L2-normalised, per key/value head) and strength beta_t = 2 sigmoid(.) of its transform
  I - beta_t w_t w_t^T of the keys before it (``model.attention.positions.turned_through``); with
  ``model.forget_gate=true`` it is PaTH-FoX (fla's ``use_forget_gate``: the same log-sigmoid gate per query head).

In that order: softcap(scores) + ALiBi bias + the forget gate's, then the causal (and window) mask, then the
softmax over the keys and the sink. ``ScoreMods`` carries a block's values to its kernel; the kernels apply them
in their own way (the manual kernel literally, sdpa through a float mask, flex through a score_mod), and the
property tests hold every kernel to the float64 formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from model import registry
from model.registry import MODIFICATIONS, register


def finite_number(value) -> bool:
    """A real number a formula can use: not a bool, a string, NaN or an infinity (YAML reads 1e400 as inf)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def spelled(value) -> str:
    """A value as an override types it, for refusals: ``null``, ``true``, ``30.0``, ``headwise``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


class Modification:
    """A modification of the attention, as a model's config sets it: a switch (``model.<field>=true``) unless a
    subclass says otherwise. Every fact is asked of the class; nothing else spells its name."""

    name: ClassVar[str]
    field: ClassVar[str]  # the GPTConfig (and AttentionSpec) field that sets it
    off: ClassVar = False  # the field's value when unused (its default)
    example: ClassVar = True  # a value that uses it (for docs and tests)
    on_scores: ClassVar[bool]  # acts between the scores and the softmax (it has a ``form``): a kernel must apply it
    column: ClassVar[str | None] = None  # its report column's title; None: another axis shows it
    label_pattern: ClassVar[str | None] = None  # its part of a run's label as a pattern, and as a legend spells it
    label_title: ClassVar[str | None] = None
    bench_help: ClassVar[str | None] = None  # help of its bench.py flag (--<field>); None: no flag of its own
    bench_off: ClassVar[str] = "off"  # the flag's value that leaves it unused (its default)
    gpt2_lacks: ClassVar[str | None] = None  # why GPT-2's format cannot hold it, for the export; None: it can

    # Its stage of the attention pipeline (model.attention.pipeline.STAGE_OPTIONS): "kernel" for a modification of the
    # scores (it has a ``form``), "encodings" (QK-norm: on the queries and keys), "gate" (on the heads' outputs)
    stage: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.on_scores = cls.form is not None
        if cls.on_scores:
            cls.stage = "kernel"

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
    def plan_bytes(cls, forward: Activations) -> float:
        """Bytes autograd keeps for it per layer in one ``forward`` (``training/plan.py``): its terms may grow with
        the queries' elements, the length, or the length squared (``Activations.scores``); 0 for most."""
        return 0

    @classmethod
    def projections(cls, spec) -> dict[str, tuple[int, bool]]:
        """The linear projections of the block's input it owns, by the block's attribute name: (width, with a bias).
        Drawn as every weight (``GPT.reset_parameters``: N(0, 0.02), biases 0)."""
        return {}

    # How it acts on the scores (``form``): "transform" (a function of each score, applied first), "bias" (a term
    # added to each score after the transforms, from the query's and key's positions), "token bias" (a term from the
    # tokens themselves: each token's ``state``, which a KV cache keeps beside its key), "sink" (one more logit in the
    # softmax's denominator, attending to nothing); None where it acts elsewhere (QK-norm on the queries and keys, the
    # gate on the outputs). A kernel applies a form its own way (the manual kernel literally, sdpa through a float
    # mask, flex in its score_mod) and says which modifications it applies (``AttentionKernel.applies``); every other
    # is refused by name.
    form: ClassVar[str | None] = None

    @classmethod
    def runtime(cls, block):
        """What the kernels need of it from an attention block, per query head (a number, or an (H,) tensor)."""
        raise NotImplementedError

    @classmethod
    def transform(cls, scores, value):
        """A "transform"'s scores -> scores (elementwise: a whole tensor, or flex's one score)."""
        raise NotImplementedError

    @classmethod
    def bias(cls, value, heads: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """A "bias"'s term of the scores of query heads ``heads`` at ``queries`` over keys at ``keys`` (broadcast:
        (H, 1, 1), (q_len, 1), (1, k_len); or flex's single indices), float32."""
        raise NotImplementedError

    @classmethod
    def state(cls, block, x: torch.Tensor) -> torch.Tensor:
        """A "token bias"'s state of each token, (B, H, T) float32, from the block's input ``x`` (B, T, C): what the
        KV cache keeps of it per key (``cache_width`` = H numbers), in the keys' dtype."""
        raise NotImplementedError

    @classmethod
    def token_bias(cls, states: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """A "token bias"'s term, (B, H, q_len, k_len) float32, of queries at positions ``queries`` (q_len,) over keys
        at ``keys`` (k_len,) whose states are ``states`` (B, H, k_len); a key at a negative position is an empty slot
        of the cache, and every query's own key is among them."""
        raise NotImplementedError

    @classmethod
    def cache_width(cls, spec) -> int:
        """Numbers a KV cache keeps per token per layer for it beside the keys and values (a "token bias"'s state per
        key); 0."""
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


class SetByPosition(Modification):
    """A modification that a position encoding brings (ALiBi, PaTH): checked, spelled and labelled as its
    ``model.position`` (the encoding's part of the label says it)."""

    @classmethod
    def check(cls, value) -> None:
        registry.position(value)

    @classmethod
    def option(cls, value) -> str:
        return f"model.position={value}"

    @classmethod
    def label(cls, value) -> str | None:
        return None  # the position's part of the label says it


@register(MODIFICATIONS)
class Alibi(SetByPosition):
    """ALiBi (Press et al. 2022): a position encoding that biases the scores, so it is set, named, shown, benched
    and refused for GPT-2 as ``model.position`` (the position encoding's own facts)."""

    name, field, off, example, form = "alibi", "position", "learned", "alibi", "bias"

    @classmethod
    def runtime(cls, block):
        return block.alibi_slopes  # (H,): a function of the head count, a buffer of the block

    @classmethod
    def bias(cls, value, heads, queries, keys):
        return -value.float()[heads] * (queries - keys).float()  # -slope x (query position - key position)

    @classmethod
    def used(cls, value) -> bool:
        return registry.position(value).biases_scores


@register(MODIFICATIONS)
class QKNorm(Modification):
    """QK-norm (Qwen3's, OLMo 2's): queries and keys RMS-normalised per head, one learned scale per head dim."""

    name, field, column, stage = "qk_norm", "qk_norm", "qk norm", "encodings"
    label_pattern, label_title = r"qknorm", "-qknorm"
    bench_help, gpt2_lacks = "QK-norm (model.qk_norm): off and/or on", "GPT-2 has no norm of the queries and keys"

    @classmethod
    def label(cls, value) -> str | None:
        return "qknorm" if value else None

    @classmethod
    def initial_values(cls, n_head: int) -> dict[str, float]:
        return {"q_norm.weight": 1.0, "k_norm.weight": 1.0}

    @classmethod
    def plan_bytes(cls, forward: Activations) -> float:
        return 2.75 * ((1 + forward.kv_share) * forward.elements) * 4  # RMSNorm's float32 steps: 2.75 copies, measured


@register(MODIFICATIONS)
class Softcap(Modification):
    """Gemma 2's logit softcap: scores -> c tanh(scores / c)."""

    name, field, off, example, column, bench_off = "softcap", "softcap", None, 30.0, "softcap", "none"
    form = "transform"

    @classmethod
    def runtime(cls, block):
        return block.softcap

    @classmethod
    def transform(cls, scores, value):
        return value * torch.tanh(scores / value)
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


@register(MODIFICATIONS)
class Sinks(Modification):
    """gpt-oss's attention sinks: a learned logit per head in the softmax's denominator, attending to nothing."""

    name, field, column, form = "sinks", "sinks", "sinks", "sink"

    @classmethod
    def runtime(cls, block):
        return block.sinks  # (H,) learned logits
    label_pattern, label_title = r"sinks", "-sinks"
    bench_help, gpt2_lacks = "attention sinks (model.sinks): off and/or on", "GPT-2's softmax has no sink"

    @classmethod
    def parameters(cls, n_head: int) -> dict[str, float]:
        return {"sinks": 0.0}


GATES = ("none", "headwise", "elementwise")


@register(MODIFICATIONS)
class Gate(Modification):
    """The output gate (Qiu et al. 2025, arXiv 2505.06708; Qwen3-Next): each head's output scaled by a sigmoid of
    a projection of the block's input, one gate per head (``headwise``) or per element (``elementwise``)."""

    name, field, off, example, column, stage = "gate", "gate", "none", "elementwise", "gate", "gate"
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
    def plan_bytes(cls, forward: Activations) -> float:
        return 2 * forward.elements * 4  # the gate's sigmoid and the heads' output it scales, kept for backward

    @classmethod
    def bench_value(cls, text: str):
        if text not in GATES:
            raise ValueError(f"--gate {text}: give {', '.join(GATES)}")
        return text


@register(MODIFICATIONS)
class ForgetGate(Modification):
    """The Forgetting Transformer's forget gate (Lin et al. 2025, arXiv 2503.02130): token t forgets by
    f_t = sigmoid(x_t w_f + b_f), one per head, and a query at i weighs the key at j by the product of the forgets
    after it, f_{j+1} ... f_i: its score gets sum_{j < l <= i} log f_l. No position encoding is needed (the paper
    trains without one)."""

    name, field, column, form = "forget_gate", "forget_gate", "forget gate", "token bias"
    label_pattern, label_title = r"forget", "-forget"
    bench_help = "the forget gate (model.forget_gate): off and/or on"
    gpt2_lacks = "GPT-2's scores have no forget gate"

    @classmethod
    def label(cls, value) -> str | None:
        return "forget" if value else None

    @classmethod
    def projections(cls, spec) -> dict[str, tuple[int, bool]]:
        return {"forget": (spec.n_head, True)}  # w_f and b_f of every head

    @classmethod
    def state(cls, block, x: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(block.forget(x).float()).transpose(1, 2)  # log f_t, (B, H, T)

    @classmethod
    def token_bias(cls, states: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return sums_between(states, queries, keys)

    @classmethod
    def cache_width(cls, spec) -> int:
        return spec.n_head  # each key's log f per head

    @classmethod
    def plan_bytes(cls, forward: Activations) -> float:
        return 4 * forward.scores  # the float32 bias of every score, kept for backward (by sdpa as its float mask)


@register(MODIFICATIONS)
class PaTH(SetByPosition):
    """PaTH's data-dependent transforms of the keys (Yang et al. 2025): a position encoding, set, named and refused for
    GPT-2 as ``model.position`` (the encoding's facts); here its projections of the block's input and what a forward
    keeps of them. At the encodings' stage: each query's keys are turned before the kernel (``form`` None)."""

    name, field, off, example, stage = "path", "position", "learned", "path", "encodings"

    @classmethod
    def used(cls, value) -> bool:
        return registry.position(value).transforms_keys

    @classmethod
    def projections(cls, spec) -> dict[str, tuple[int, bool]]:
        # w_t of every key/value head at full rank (fla's under grouped heads; its MHA layer goes through rank 32)
        return {"path_w": (spec.kv_heads * spec.head_dim, False), "path_beta": (spec.kv_heads, True)}

    @classmethod
    def directions(cls, block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's unit direction w_t, (B, kv, T, d), and strength beta_t in (0, 2), (B, kv, T), float32."""
        B, T, _ = x.shape
        w = block.path_w(x).float().view(B, T, block.n_kv_head, -1).transpose(1, 2)
        w = w * torch.rsqrt(w.pow(2).sum(-1, keepdim=True) + L2_EPS)
        return w, 2 * torch.sigmoid(block.path_beta(x).float()).transpose(1, 2)

    @classmethod
    def plan_bytes(cls, forward: Activations) -> float:
        # the widened queries and keys (T more dims each, float32) and the solve's (T, T) terms per head, kept for
        # backward: about six score matrices' worth
        return 4 * 6 * forward.scores


L2_EPS = 1e-6  # PaTH's L2 norm of w_t: w / sqrt(|w|^2 + eps), fla's


def sums_between(states: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(B, H, q_len, k_len): for a query at position i and a key at position j, the sum of the ``states`` (B, H, k_len)
    of the keys at positions j < p <= i (every such position is held: a cache keeps the most recent ones, the query's
    own included). Prefix sums in position order, not slot order (a ring that has wrapped, a static step's cache with
    empty slots at negative positions, which count 0), so each sum runs over at most the keys given."""
    order = keys.argsort()
    held = keys[order]
    through = torch.where(held >= 0, states[..., order].float(), 0.0).cumsum(-1)  # through each key, in order
    through_key = through[..., order.argsort()]
    through_query = through[..., torch.searchsorted(held, queries)]  # through the query's own key
    return through_query[..., :, None] - through_key[..., None, :]


def with_fields() -> list[type[Modification]]:
    """The modifications that have a config field and report column of their own (ALiBi's are the position
    encoding's), in the registry's order."""
    return [mod for mod in MODIFICATIONS.values() if mod.column is not None]


def score_mod_fields() -> tuple[str, ...]:
    """The config fields of the modifications that have their own (``with_fields``)."""
    return tuple(mod.field for mod in with_fields())


def on_scores() -> tuple[str, ...]:
    """The modifications that act between the scores and the softmax, by name: what a kernel may apply."""
    return tuple(name for name, mod in MODIFICATIONS.items() if mod.on_scores)


STATES_SLOT = -1  # a layer cache's slot of the token biases' states per key (the layouts' keys and values: 0, 1, ...)


@dataclass(frozen=True)
class Activations:
    """One layer's forward, for a modification's plan term (``Modification.plan_bytes``)."""

    batch: int
    length: int
    heads: int
    elements: int  # one (batch, length, width) tensor: the queries
    kv_share: float  # keys and values are this share of the queries' elements

    @property
    def scores(self) -> int:
        """Elements of one (batch, heads, length, length) term: a score matrix per head."""
        return self.batch * self.heads * self.length * self.length


def on_the_scores(spec) -> list[type[Modification]]:
    """The modifications of the scores ``spec`` uses (``form``), in the registry's order."""
    return [mod for mod in MODIFICATIONS.values() if mod.form is not None and mod.used(getattr(spec, mod.field))]


@dataclass(frozen=True)
class ScoreMods:
    """One attention block's modifications of the scores, for its query heads (a wrapper head gets its own slice):
    each registered one it uses (``on_the_scores``) with what the kernels need of it (``Modification.runtime``). They
    act on the scores of queries and keys at their absolute positions (the kernels pass both: keys in position
    order, or at the positions a wrapped ring or a static step's cache holds them): the transforms first, then the
    biases, then the masks, then the softmax over the keys and the sink."""

    used: tuple  # ((mod class, its value), ...), in the registry's order
    # What the biases' values are a function of (an attention block's head count; a wrapper head's index too), so
    # that the kernels build one float mask per forward for all layers alike; None: unknown, built per call.
    bias_key: tuple | None = None

    @classmethod
    def of_block(cls, block, mods: list[type[Modification]], x: torch.Tensor | None = None) -> ScoreMods | None:
        """A block's modifications (its ``mods``: ``on_the_scores`` of its spec) at its input ``x`` (a token bias's
        states are the tokens'), or None where it has none."""
        if not mods:
            return None
        return cls(tuple((mod, mod.state(block, x) if mod.form == "token bias" else mod.runtime(block))
                         for mod in mods), bias_key=(block.n_head,))  # fmt: skip

    def kept(self, cache, like: torch.Tensor) -> ScoreMods:
        """With the states of the keys the new queries attend over: the new tokens' token-bias states stored in the
        layer's KV cache (``cache``, a LayerCache, or None: no cache), in its slot ``STATES_SLOT``, in the keys'
        dtype (``like``; ``cache_width`` numbers per key), and the ones it holds returned in their place."""
        states = [value for _, value in self.of_form("token bias")]
        if not states or cache is None:
            return self
        *held, _ = cache.update(STATES_SLOT, *(state.to(like.dtype).unsqueeze(-1) for state in states))
        kept = iter(t.squeeze(-1) for t in held)
        return replace(self, used=tuple((mod, next(kept) if mod.form == "token bias" else value)
                                        for mod, value in self.used))  # fmt: skip

    def of_form(self, form: str) -> list[tuple[type[Modification], object]]:
        return [(mod, value) for mod, value in self.used if mod.form == form]

    @property
    def sinks(self) -> torch.Tensor | None:
        """The sink logits, (H,), or None."""
        return next((value for _, value in self.of_form("sink")), None)

    @property
    def needs_float_mask(self) -> bool:
        """Whether sdpa takes them through its float mask: any of them (sdpa refuses what a float mask cannot hold,
        a transform, before any work: ``AttentionKernel.applies``)."""
        return bool(self.used)

    @property
    def biased(self) -> bool:
        return bool(self.of_form("bias"))

    @property
    def token_biased(self) -> bool:
        """Whether a bias comes from the tokens (a float mask of its own each forward, each layer)."""
        return bool(self.of_form("token bias"))

    def bias_dtypes(self) -> tuple:
        """The biases' values' dtypes and devices: part of what a float mask built once is a function of."""
        return tuple((v.dtype, v.device) for _, v in self.of_form("bias") if isinstance(v, torch.Tensor))

    def head(self, h: int) -> ScoreMods:
        """The modifications of query head ``h`` alone (a head axis of size 1): each per-head value sliced."""
        one = slice(h, h + 1)  # a token bias's states are (B, H, k_len): heads second

        def sliced(mod, value):
            if not isinstance(value, torch.Tensor) or not value.dim():
                return value
            return value[:, one] if mod.form == "token bias" else value[one]

        used = tuple((mod, sliced(mod, value)) for mod, value in self.used)
        return replace(self, used=used, bias_key=None if self.bias_key is None else (*self.bias_key, h))

    def bias(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """(H, q_len, k_len), or (B, H, q_len, k_len) with a token bias: the biases' terms of queries at ``queries``
        (q_len,) over keys at ``keys`` (k_len,), float32; None without a bias."""
        total = self.token_biases(queries, keys)
        for mod, value in self.of_form("bias"):
            heads = torch.arange(len(value), device=queries.device)[:, None, None]
            term = mod.bias(value, heads, queries[:, None], keys[None, :])
            total = term if total is None else total + term
        return total

    def token_biases(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """(B, H, q_len, k_len): the token biases' terms (their states are the keys'), float32; None without one."""
        total = None
        for mod, states in self.of_form("token bias"):
            term = mod.token_bias(states, queries, keys)
            total = term if total is None else total + term
        return total

    def modify(self, scores: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(B, H, q_len, k_len) scaled scores of queries and keys at these positions -> transformed and biased
        (before the mask)."""
        for mod, value in self.of_form("transform"):
            scores = mod.transform(scores, value)
        bias = self.bias(queries, keys)
        return scores if bias is None else scores + bias.to(scores.dtype)

    def flex_score(self, score, h, query, key):
        """flex's score_mod body for one score of head ``h``, query and key at these positions (the sink and the token
        biases apart: flex reads those from a tensor, ``model.attention.kernels``)."""
        for mod, value in self.of_form("transform"):
            score = mod.transform(score, value)
        for mod, value in self.of_form("bias"):
            score = score + mod.bias(value, h, query, key).to(score.dtype)
        return score

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

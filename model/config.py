"""GPTConfig: the shape of a GPT and the attention implementation it uses.

The one declaration of a model: Hydra's ``model`` config group validates
against it, checkpoints store it, and every script rebuilds models from it.
The defaults are GPT-2 small's shape; ``configs/model/*.yaml`` change only
what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model import registry
from model.attention import check_heads
from model.kernels import SDPA_BACKENDS
from model.registry import KERNELS, lookup

VOCAB_MULTIPLE = 64  # pad the embedding/LM head to a multiple of this for faster matmuls


def kernel_option(model: dict) -> str:
    """The kernel as the ``kernel=`` option spells it: ``sdpa_flash`` for SDPA held to its flash implementation."""
    return registry.kernel_option(model["kernel"], model.get("sdpa_backend", "auto"))


def attention_label(model: dict, sep: str = "-", show: tuple[str, ...] | list[str] = ()) -> str:
    """How a model attends, spelled as its options are: ``<attention>-<kernel>``, then ``-kv<n>`` for fewer
    key/value heads than query heads and ``-window<w>`` for a sliding window: ``fused_qkv-sdpa_flash``,
    ``wrapper-sdpa-kv2``, ``fused_qkv-sdpa-window64``. The one name of a variant: run names, sweep
    directories, report tables and plot legends all use it.

    ``model`` is a GPTConfig's fields (a dict: run.json holds them too). ``show`` names the axes
    (``n_kv_head``, ``window``) spelled even at their default (``-kv4`` of 4 heads, ``-nowindow``): those a
    sweep or a report varies. ``sep`` joins the parts.
    """
    parts = [model["attention"], kernel_option(model)]
    kv = model.get("n_kv_head") or model.get("n_head")
    if kv != model.get("n_head") or "n_kv_head" in show:
        parts.append(f"kv{kv}")
    window = model.get("window")
    if window or "window" in show:
        parts.append(f"window{window}" if window else "nowindow")
    return sep.join(parts)


@dataclass
class GPTConfig:
    # metadata "reuse": what a change of the field means to a checkpoint reused by trainer.resume or
    # trainer.init_from (training/reuse.py keeps one rule over it)
    name: str = field(default="gpt2_small", metadata={"reuse": "label"})  # for run names and reports; no effect
    vocab_size: int | None = field(default=None, metadata={"reuse": "weights"})  # None: the tokenizer's, at training
    block_size: int = field(default=1024, metadata={"reuse": "positions"})
    n_layer: int = field(default=12, metadata={"reuse": "weights"})
    n_head: int = field(default=12, metadata={"reuse": "weights"})
    n_embd: int = field(default=768, metadata={"reuse": "weights"})
    dropout: float = field(default=0.0, metadata={"reuse": "training"})
    bias: bool = field(default=True, metadata={"reuse": "weights"})
    attention: str = field(default="fused_qkv", metadata={"reuse": "layout"})  # the QKV layout: wrapper | ...
    kernel: str = field(default="sdpa", metadata={"reuse": "implementation"})  # manual | sdpa | flex
    # key/value heads: None = n_head (multi-head), 1 = multi-query, else grouped-query
    n_kv_head: int | None = field(default=None, metadata={"reuse": "weights"})
    # sliding-window attention: each position sees this many (itself included); None: all
    window: int | None = field(default=None, metadata={"reuse": "function"})
    # kernel=sdpa's implementation: auto | flash | efficient | cudnn | math
    sdpa_backend: str = field(default="auto", metadata={"reuse": "implementation"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        check_heads(self.n_embd, self.n_head)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be in [0, 1)")
        registry.layout(self.attention)
        kernel = registry.kernel(self.kernel)
        kv = self.n_kv_head
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_head % kv):
            problem = "does not divide" if isinstance(kv, int) and kv >= 1 else "is not a positive divisor of"
            raise ValueError(f"model.n_kv_head={kv!r} {problem} model.n_head={self.n_head}; choose a divisor "
                             f"of n_head (1: multi-query, n_head or null: multi-head)")  # fmt: skip
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window < 1):  # fmt: skip
            raise ValueError(f"model.window={self.window!r} must be a positive number of positions, or null (all)")
        lookup(SDPA_BACKENDS, "model.sdpa_backend", self.sdpa_backend)
        if self.sdpa_backend != "auto" and self.sdpa_backend not in kernel.backends:
            takers = " or ".join(name for name, k in KERNELS.items() if self.sdpa_backend in k.backends)
            raise ValueError(f"model.sdpa_backend={self.sdpa_backend} chooses kernel={takers}'s implementation, but "
                             f"kernel={self.kernel}; use kernel={takers}, or model.sdpa_backend=auto")  # fmt: skip
        if not kernel.has_dropout and self.dropout > 0:
            others = " or ".join(name for name, k in KERNELS.items() if k.has_dropout)
            raise ValueError(f"kernel={self.kernel} has no attention dropout, but model.dropout={self.dropout}; set "
                             f"model.dropout=0, or use kernel={others}")  # fmt: skip

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or ``n_head`` (multi-head) when unset."""
        return self.n_kv_head or self.n_head

    @property
    def cache_capacity(self) -> int:
        """Positions a KV cache keeps per layer: the context, or the window when shorter."""
        return min(self.block_size, self.window or self.block_size)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        if self.vocab_size is None:
            raise ValueError("vocab_size is not set; set model.vocab_size or let training take it from the tokenizer")
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

"""GPTConfig: the shape of a GPT and the attention implementation it uses.

The one declaration of a model: Hydra's ``model`` config group validates
against it, checkpoints store it, and every script rebuilds models from it.
The defaults are GPT-2 small's shape; ``configs/model/*.yaml`` change only
what differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.attention import ATTENTION_LAYOUTS, check_heads
from model.kernels import KERNELS
from model.registry import lookup

VOCAB_MULTIPLE = 64  # pad the embedding/LM head to a multiple of this for faster matmuls


@dataclass
class GPTConfig:
    name: str = "gpt2_small"  # a label for run names and reports; no effect on the model
    vocab_size: int | None = None  # None: filled in from the tokenizer when training starts
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    attention: str = "fused_qkv"  # the QKV layout: wrapper | separate_qkv | fused_qkv
    kernel: str = "sdpa"  # manual | sdpa

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
        lookup(ATTENTION_LAYOUTS, "attention layout", self.attention)
        lookup(KERNELS, "attention kernel", self.kernel)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        if self.vocab_size is None:
            raise ValueError("vocab_size is not set; set model.vocab_size or let training take it from the tokenizer")
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

"""GPTConfig: the shape of a GPT and the attention implementation it uses."""

from __future__ import annotations

from dataclasses import dataclass

from model.attention import ATTENTION_LAYOUTS, check_heads
from model.kernels import KERNELS
from model.registry import lookup

VOCAB_MULTIPLE = 64  # pad the embedding/LM head to a multiple of this for faster matmuls


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    attention: str = "fused_qkv"  # wrapper | separate_qkv | fused_qkv
    kernel: str = "sdpa"  # manual | sdpa

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
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
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

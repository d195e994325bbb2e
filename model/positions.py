"""Position encodings: how the model knows where a token is.

The GPT computes its tokens' positions once (0..T-1, or after the cached ones, or a static decode step's
position tensor) and gives them to the encoding, which says what to add to the token embeddings, and to
every block's attention, which today passes them through: an encoding that acts on the queries and keys
(rotary, ALiBi) uses them there. Today's one encoding is GPT-2's learned absolute embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from model.config import GPTConfig


class LearnedPositions(nn.Embedding):
    """A learned vector per absolute position, 0 .. block_size-1, added to the token embeddings (GPT-2's).

    An ``nn.Embedding`` itself, so its weight keeps GPT-2's name (``transformer.wpe.weight``).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config.block_size, config.n_embd)

    def to_add(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) positions -> (T, n_embd): what the tokens at those positions get added."""
        return self(positions)


def build_positions(config: GPTConfig) -> LearnedPositions:
    """The position encoding of a model config (learned: the only one yet)."""
    return LearnedPositions(config)

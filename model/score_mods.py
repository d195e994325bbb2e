"""Score modifications: what a model does to the attention scores between Q K^T / sqrt(d) and the softmax.

Three, each a config value and a fact of the kernels that take it (``AttentionKernel.score_mods``):

- ``alibi`` (``model.position=alibi``): head h adds -slope_h x (query position - key position);
- ``softcap`` (``model.softcap=c``, Gemma 2): scores become c x tanh(scores / c), before the bias and mask;
- ``sinks`` (``model.sinks=true``, gpt-oss): a learned logit per head joins the softmax's denominator and
  attends to nothing: a head may put weight on "no key" instead of being forced to spread it.

In that order: softcap(scores) + ALiBi bias, then the causal (and window) mask, then the softmax over the
keys and the sink. ``ScoreMods`` carries a block's values to its kernel; the kernels apply them in their
own way (the manual kernel literally, sdpa through a float mask, flex through a score_mod), and the
property tests hold every kernel to the float64 formula.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

MOD_NAMES = ("alibi", "softcap", "sinks")


@dataclass(frozen=True)
class ScoreMods:
    """One attention block's score modifications, for its query heads (a wrapper head gets its own slice).

    ``span`` turns a key's slot into its distance from a query: keys are held in slot = position mod span
    (the attention's context, which is the KV cache's capacity: in position order until it wraps, a ring
    after), so distance = (query position - slot) mod span for every key a query sees. 0: an attention block
    built alone, with no context or window, whose keys are always in position order.
    """

    span: int
    slopes: torch.Tensor | None = None  # (H,) ALiBi
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # (H,) learned logits
    # What the slopes' values are a function of (an attention block's head count; a wrapper head's index too),
    # so that the kernels build one bias per forward for all layers alike; None: unknown, built per call.
    slopes_key: tuple | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The modifications in use, by their config names."""
        present = (self.slopes is not None, self.softcap is not None, self.sinks is not None)
        return tuple(name for name, used in zip(MOD_NAMES, present) if used)

    def head(self, h: int) -> ScoreMods:
        """The modifications of query head ``h`` alone (a head axis of size 1)."""
        one = slice(h, h + 1)
        return replace(self, slopes=None if self.slopes is None else self.slopes[one],
                       sinks=None if self.sinks is None else self.sinks[one],
                       slopes_key=None if self.slopes_key is None else (*self.slopes_key, h))  # fmt: skip

    def distances(self, positions: torch.Tensor, k_len: int) -> torch.Tensor:
        """(q_len, k_len): each query's distance to each key slot (meaningful where the query sees it)."""
        slots = torch.arange(k_len, device=positions.device)
        distance = positions[:, None] - slots[None, :]
        return distance.remainder(self.span) if self.span else distance  # span 0: keys in position order, no ring

    def bias(self, positions: torch.Tensor, k_len: int) -> torch.Tensor | None:
        """(H, q_len, k_len) ALiBi's -slope x distance, or None without ALiBi."""
        if self.slopes is None:
            return None
        return -self.slopes.float()[:, None, None] * self.distances(positions, k_len).float()

    def modify(self, scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, H, q_len, k_len) scaled scores -> capped and biased (before the mask)."""
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        bias = self.bias(positions, scores.size(-1))
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

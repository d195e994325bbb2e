"""Differential attention (Ye et al. 2024, the Diff Transformer, arXiv 2410.05258): ``model.differential=true``.

Query heads 2h and 2h+1 form one output head. Its attention weights are the difference of their two softmax maps,
A_2h - lambda A_2h+1, read over both heads' values side by side ([v_2h, v_2h+1]: 2 x head_dim wide), so noise
that both maps put on the same keys cancels. Each output head is then RMS-normalised (no learned scale, as
transformers' DiffLlama) and scaled by (1 - lambda_init), and the n_head / 2 heads of 2 x head_dim fill the same
width as before: c_proj, the parameters and the KV cache are unchanged.

Key/value heads pair the same way (the paper's grouped form, its multihead_diffattn.py): key/value heads 2g and
2g+1 are group g's, and every differential head h of the group (h // (n_head / n_kv_head) = g) reads key 2g with
its first map, key 2g+1 with its second, and the value [v_2g, v_2g+1], 2 x head_dim wide. So n_kv_head is even
(2: one group, multi-query), and with n_kv_head = n_head each pair reads its own keys and values, as before. Pairing
query heads 2h with 2h+1 is the paper's convention; DiffLlama (transformers) pairs heads h and h + n_head / 2, and
key/value heads g and g + n_kv_head / 2: the same function under a permutation of the heads' weights.

lambda is learned per layer, shared by its heads: exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) +
lambda_init, the four vectors head_dim wide, drawn N(0, 0.1). The paper starts lambda_init by depth,
0.8 - 0.6 exp(-0.3 (l - 1)); its ablation found a constant 0.8 as good, which is the default here
(``model.lambda_init``; a schedule's kinds may set it per layer).

Every kernel runs it unchanged, at the head's width: each of the n_head maps reads one half of its pair's values,
then the other (two calls, A_i v_2h and A_i v_2h+1, as transformers' DiffLlama runs flash attention), and the
difference is taken on the outputs, the same function as taking it on the weights (the product is linear). One call
over values twice as wide would compute the maps once, but SDPA's flash kernels take one head width only: on this
CPU it fell back to the math kernel, which keeps every (T, T) map for backward. The model's FLOPs count the maps
once and the value products twice as wide (``score_widths``). With attention dropout in training it is one call over
the halves side by side, so that both halves lose the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LAMBDA_INIT = 0.8  # lambda_init by default: the constant the paper's ablation found as good as its depth rule
LAMBDA_STD = 0.1  # the lambda vectors' initial draw (the paper's, DiffLlama's lambda_std_dev)
NORM_EPS = 1e-5  # each output head's RMSNorm (the paper's code and DiffLlama's rms_norm_eps)
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


class DifferentialHeads(nn.Module):
    """The learned lambda of one layer, and what turns n_head maps' outputs into n_head / 2 differential heads."""

    def __init__(self, head_dim: int, lambda_init: float) -> None:
        super().__init__()
        for name in LAMBDAS:
            setattr(self, name, nn.Parameter(torch.randn(head_dim) * LAMBDA_STD))
        self.lambda_init = lambda_init

    def weight(self) -> torch.Tensor:
        """lambda, a float32 scalar: exp(q1 . k1) - exp(q2 . k2) + lambda_init."""
        first = torch.exp(torch.dot(self.lambda_q1.float(), self.lambda_k1.float()))
        second = torch.exp(torch.dot(self.lambda_q2.float(), self.lambda_k2.float()))
        return first - second + self.lambda_init

    @staticmethod
    def paired(t: torch.Tensor, n_head: int) -> torch.Tensor:
        """(B, KV, S, d) key (or value) heads -> (B, n_head, S, d), the one each map reads: map 2h + c (c = 0, 1) of
        differential head h reads head 2g + c of its group g = h // (n_head / KV)."""
        B, KV, S, d = t.shape
        return t.view(B, KV // 2, 2, S, d).repeat_interleave(n_head // KV, dim=1).view(B, n_head, S, d)

    @classmethod
    def value_halves(cls, v: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, KV, S, d) value heads -> the two halves both maps of differential head h read, v_2g and v_2g+1 of its
        group g, (B, n_head, S, d) each."""
        pairs = cls.paired(v, n_head)
        return pairs[:, 0::2].repeat_interleave(2, dim=1), pairs[:, 1::2].repeat_interleave(2, dim=1)

    def combine(self, y: torch.Tensor) -> torch.Tensor:
        """(B, H, T, 2d), each map's output over its pair's values ([A_i v_2h, A_i v_2h+1]) -> (B, H / 2, T, 2d): map
        2h's minus lambda
        times map 2h+1's, RMS-normalised per head and scaled by (1 - lambda_init)."""
        diff = y[:, 0::2] - self.weight().to(y.dtype) * y[:, 1::2]
        return F.rms_norm(diff, (diff.size(-1),), eps=NORM_EPS) * (1 - self.lambda_init)

    @staticmethod
    def initial(name: str, template: torch.Tensor) -> torch.Tensor | None:
        """A lambda vector's initial draw (``GPT.reset_parameters``), N(0, 0.1); None for any other tensor."""
        if name.rsplit(".", 1)[-1] in LAMBDAS:
            return torch.empty_like(template).normal_(0.0, LAMBDA_STD)
        return None

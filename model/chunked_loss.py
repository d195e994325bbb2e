"""The LM head and the cross-entropy computed together, a chunk of tokens at a time (``trainer.loss_chunk``).

The plain loss makes the (tokens, vocab) logits, a float32 copy for the softmax, and in the backward pass a
gradient of that size: at GPT-2's vocabulary and 12 x 1024 tokens, 2.5 GB per float32 copy. Here the head's product
and the loss run over ``chunk`` tokens at a time and, when gradients are wanted, each chunk's gradients are made at
once in the forward pass (softmax minus the target's one-hot, through the head's two products), as Liger-Kernel's
fused linear cross-entropy does: no chunk's logits outlive it, and the backward pass only scales the gradients kept.
The same products as the plain loss (no recomputation); what is kept instead is one gradient of the hidden states
(tokens x width) and one of the head's weight (vocab x width), both float32.

Targets of -1 are ignored, as ``F.cross_entropy(ignore_index=-1)`` does; the loss is the mean over the others (NaN
where there are none, as there).
"""

from __future__ import annotations

import torch


def chunk_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int) -> torch.Tensor:
    """Each row's cross-entropy (0 where the target is -1), float32: (rows,) from (rows, width) hidden states, the
    head's (padded vocab, width) weight and (rows,) targets; the logits beyond ``vocab`` (padding) are left out."""
    logits = (hidden @ weight[:vocab].t()).float()
    picked = logits.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    return (logits.logsumexp(dim=1) - picked) * (targets != -1)


def token_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int,
                 chunk: int) -> torch.Tensor:  # fmt: skip
    """Every row's loss (``chunk_losses``), ``chunk`` rows at a time, without gradients: (rows,) float32."""
    with torch.no_grad():
        return torch.cat([chunk_losses(hidden[s : s + chunk], weight, targets[s : s + chunk], vocab)
                          for s in range(0, hidden.size(0), chunk)])  # fmt: skip


class HeadAndLoss(torch.autograd.Function):
    """The mean cross-entropy of ``hidden @ weight[:vocab].T`` against ``targets``, its gradients made chunk by chunk
    in the forward pass."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int,
                chunk: int) -> torch.Tensor:  # fmt: skip
        counted = (targets != -1).sum().float()  # 0 (every target ignored): NaN, as the plain loss gives
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        head = weight[:vocab]
        for s in range(0, hidden.size(0), chunk):
            rows, wanted = hidden[s : s + chunk], targets[s : s + chunk]
            logits = (rows @ head.t()).float()  # under autocast: the product in its dtype, the softmax in float32
            log_norm = logits.logsumexp(dim=1, keepdim=True)
            kept = (wanted != -1).unsqueeze(1)
            at_target = wanted.clamp(min=0).unsqueeze(1)
            total += ((log_norm - logits.gather(1, at_target)) * kept).sum()
            # d(loss)/d(logits) = (softmax - one-hot) / counted, 0 on ignored rows; made in place over the logits, and
            # divided by counted only after the products (in float16 a gradient that small would underflow there)
            grad = logits.sub_(log_norm).exp_()
            grad.scatter_add_(1, at_target, -torch.ones_like(at_target, dtype=grad.dtype))
            grad = grad.mul_(kept).to(rows.dtype)  # the products' dtype (autocast casts it again where it is on)
            grad_hidden[s : s + chunk] = grad @ head
            grad_weight[:vocab] += grad.t() @ rows
        grad_hidden /= counted.clamp(min=1)  # every target ignored: no gradient, as the plain loss's backward gives
        grad_weight /= counted.clamp(min=1)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return total / counted

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (grad_hidden.mul(grad_loss).to(hidden_dtype), grad_weight.mul(grad_loss).to(weight_dtype),
                None, None, None)  # fmt: skip


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int,
              chunk: int) -> torch.Tensor:  # fmt: skip
    """The mean cross-entropy of the head's logits, ``chunk`` rows at a time: (rows, width) hidden states, the head's
    (padded vocab, width) weight, (rows,) targets (-1 ignored). With gradients wanted, ``HeadAndLoss``; without, the
    chunks' losses alone."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return HeadAndLoss.apply(hidden, weight, targets, vocab, chunk)
    losses = token_losses(hidden, weight, targets, vocab, chunk)
    return losses.sum() / (targets != -1).sum()

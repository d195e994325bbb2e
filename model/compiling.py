"""torch.compile for training: the repeated block compiled once and reused, or the whole model in one graph.

``scope="block"`` (regional compilation, as torchtitan compiles): every transformer block is compiled
in place. The blocks run the same code, and Dynamo treats a module's parameters as graph inputs, so
the graph compiled for the first block serves all ``n_layer`` of them: compile time no longer grows
with depth, which matters most for the wrapper layout, whose blocks hold 3 x n_head projections. The
final norm, LM head and loss form a second compiled region; the embeddings stay eager.
``scope="model"``: one graph for the whole forward (``torch.compile(model)``), the blocks inlined
n_layer times; slower to compile, and free to fuse across block boundaries.

Either way the parameters and state-dict names are untouched (no ``_orig_mod.`` prefix in place).
Code that must run eagerly on a compiled model (sampling with a KV cache, evaluation) uses ``eager()``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.device import inductor_cache_per_cpu_capability

if TYPE_CHECKING:
    from model.gpt import GPT

COMPILE_SCOPES = ("block", "model")
# inductor's modes (torch.compile's ``mode``): default; reduce-overhead replays each compiled graph as a CUDA graph
# (inductor's graph trees: the launches of a small model's step at once; nothing on a CPU); max-autotune-no-cudagraphs
# tunes the matmuls' kernels (minutes of compilation)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def compile_for_training(model: GPT, scope: str = "block", mode: str = "default") -> nn.Module:
    """Compile ``model`` for training steps, in inductor's ``mode``; returns the module to call (``model`` itself for
    ``block``)."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope {scope!r}; choose one of: {', '.join(COMPILE_SCOPES)}")
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {mode!r}; choose one of: {', '.join(COMPILE_MODES)}")
    inductor_cache_per_cpu_capability()
    torch._dynamo.reset()  # a multirun's previous job may have left compiled graphs
    if scope == "model":
        return torch.compile(model, mode=mode)
    for block in model.transformer.h:
        block.compile(mode=mode)
    model.logits_and_loss = torch.compile(model.logits_and_loss, mode=mode)
    return model


def eager():
    """Within the block, compiled code runs eagerly (sampling with a cache, evaluation): no new compilation.
    A process that never compiled has not imported the compiler (seconds at start-up): nothing to do there."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


def is_compiled(model: nn.Module) -> bool:
    """torch.compile in any form, anywhere in the model: ``torch.compile(model)``, ``module.compile()``,
    a compiled ``forward`` or method assigned to the instance."""
    if hasattr(model, "_orig_mod"):
        return True
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            return True
        if any(hasattr(value, "_torchdynamo_orig_callable") for value in vars(module).values()):
            return True
    return False

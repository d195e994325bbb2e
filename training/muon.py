"""Muon for the hidden matrices and AdamW for the rest, in one optimizer (``optim=muon``).

Muon (Keller Jordan, 2024; ``torch.optim.Muon``) keeps SGD momentum per matrix and replaces each update with an
orthogonalised one: the Newton-Schulz iteration's approximation of U V^T for the momentum's U S V^T, scaled by the
matrix's shape (``optim.muon_adjust_lr``). torch computes the iteration in bfloat16; here it runs in the run's own
precision, as nanochat's does: bfloat16 when the run trains in bfloat16 or float16 (a GPU's), float32 when it trains
in float32 (a CPU's, where bfloat16 matmuls are emulated: 15x slower than float32's on an AVX2 CPU, measured).

Muon acts on whole matrices, so how a layer stores its weights decides what it orthogonalises: fused_qkv's one
3C x C projection, separate_qkv's three C x C ones and the wrapper's per-head ones are different problems.
``optim.muon_split`` chooses the matrices:

- ``as_stored``: each 2-D weight as its layout stores it (what ``torch.optim.Muon`` does with the parameters it is
  given, and what this optimizer then equals, orthogonalising in bfloat16);
- ``qkv``: each projection apart (Q, K and V; a latent's down-projection; a linear layer's gate), its rows gathered
  from wherever the layout keeps them: the three layouts of one function take the same steps;
- ``heads``: each head of each projection apart.

A layer says how its weights split (``matrix_rows`` of its class, model/); a weight it does not name (``c_proj``,
the MLP's) is one matrix in every split. Embeddings (with the tied LM head), norms, biases, scalars and any weight
of more than two dimensions go to AdamW, which is ``torch.optim.AdamW`` itself, sharing this optimizer's parameter
groups and state: one object that the trainer steps, clips (before the step, as for AdamW), checkpoints
(``state_dict``: Muon's one momentum buffer per matrix, AdamW's two moments) and resumes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

# Newton-Schulz's quintic coefficients and its normalisation's floor: torch.optim.Muon's (Keller Jordan's)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(matrices: torch.Tensor, steps: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Orthogonalise each of ``matrices`` (n, rows, cols) as ``torch.optim.Muon`` does one matrix: in ``dtype``
    (torch's: bfloat16), a wide matrix's rows (a tall one transposed), scaled to a Frobenius norm of at most 1, then
    ``steps`` quintic iterations; the same operations batched (on a CPU bit for bit torch's, tests/test_muon.py)."""
    a, b, c = NS_COEFFICIENTS
    x = matrices.to(dtype)
    tall = matrices.size(-2) > matrices.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def adjusted_lr(lr: float, adjustment: str, rows: int, cols: int) -> float:
    """The learning rate of a ``rows`` x ``cols`` matrix's orthogonalised update (``optim.muon_adjust_lr``):
    ``original`` sqrt(max(1, rows / cols)) (Keller Jordan's, torch's default), ``match_rms_adamw`` 0.2 sqrt(max(rows,
    cols)) (Moonshot's: an update of AdamW's RMS), ``none``."""
    if adjustment == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjustment == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


@dataclass(frozen=True)
class Piece:
    """Rows ``start:end`` of one stored weight."""

    param: nn.Parameter
    start: int
    end: int


@dataclass(frozen=True)
class Matrix:
    """One matrix Muon orthogonalises: pieces of stored weights stacked by rows (a whole weight, or a projection's rows
    gathered from one or several weights). ``name`` says which, for messages and tests."""

    name: str
    pieces: tuple[Piece, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.end - p.start for p in self.pieces), self.pieces[0].param.size(1)

    def gather(self, updates: dict[nn.Parameter, torch.Tensor]) -> torch.Tensor:
        parts = [updates[p.param][p.start : p.end] for p in self.pieces]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def pairs(self, update: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(a piece of the weights, its rows of the orthogonalised ``update``): what each piece moves by."""
        row = 0
        for p in self.pieces:
            n = p.end - p.start
            yield p.param[p.start : p.end], update[row : row + n]
            row += n


def is_hidden_matrix(name: str, param: nn.Parameter, embeddings: set[int]) -> bool:
    """A 2-D weight inside the network: not an embedding or the LM head (tied to the token embedding)."""
    return param.dim() == 2 and id(param) not in embeddings and not name.startswith("lm_head.")


def embedding_ids(model: nn.Module) -> set[int]:
    return {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}


def declared_parts(model: nn.Module) -> Iterator[tuple[str, str, nn.Module, dict | None]]:
    """(the layer's name, the declaring module's name, the module, its ``matrix_rows``) for each module of an attention
    layer (a module that keeps its ``spec``) whose class says how its weights split: the layer itself and modules
    inside it (a sparse indexer)."""
    for layer_name, layer in model.named_modules():
        spec = getattr(layer, "spec", None)
        if spec is None or not hasattr(type(layer), "matrix_rows"):
            continue
        for inner_name, inner in layer.named_modules():
            declare = getattr(type(inner), "matrix_rows", None)
            if declare is not None:
                name = ".".join(part for part in (layer_name, inner_name) if part)
                yield layer_name, name, inner, declare(spec)


def hidden_matrices(model: nn.Module, split: str) -> list[Matrix]:
    """The matrices Muon orthogonalises under ``split`` (as_stored | qkv | heads), each 2-D hidden weight's rows in
    exactly one. A layer whose class does not say how its weights split (``matrix_rows`` None) refuses qkv and heads."""
    embeddings = embedding_ids(model)
    params = {name: p for name, p in model.named_parameters() if is_hidden_matrix(name, p, embeddings)}
    grouped: dict[tuple, list[Piece]] = {}  # (layer, projection[, head]) -> its pieces, in the layer's order
    claimed: set[str] = set()  # the weights split by their layer's declaration; every other one is whole
    for layer_name, module_name, module, rows in declared_parts(model) if split != "as_stored" else ():
        if rows is None:
            raise ValueError(f"optim.muon_split={split}: the layer {layer_name} ({type(module).__name__}) does not say "
                             f"how its weights split into projections and heads; use optim.muon_split=as_stored")
        for weight, parts in rows.items():
            full = f"{module_name}.{weight}"
            check_tiles(full, params.get(full), parts)
            claimed.add(full)
            for projection, head, start, end in parts:
                key = (layer_name, projection, *((head,) if split == "heads" and head is not None else ()))
                grouped.setdefault(key, []).append(Piece(params[full], start, end))
    matrices = [Matrix(name, (Piece(p, 0, p.size(0)),)) for name, p in params.items() if name not in claimed]
    for (layer, projection, *head), pieces in grouped.items():
        matrices.append(Matrix(f"{layer}: {projection}" + (f" head {head[0]}" if head else ""), tuple(pieces)))
    return matrices


def check_tiles(name: str, param: nn.Parameter | None, parts: list[tuple[str, int | None, int, int]]) -> None:
    """A layer's ``matrix_rows`` must name one of its 2-D weights and cover each of its rows once."""
    if param is None:
        raise ValueError(f"matrix_rows names {name}, which is not a 2-D weight of the model")
    spans = sorted((start, end) for _, _, start, end in parts)
    covered = 0
    for start, end in spans:
        if start != covered or end <= start:
            break
        covered = end
    if covered != param.size(0):
        raise ValueError(f"matrix_rows of {name} covers rows {spans}, not each of its {param.size(0)} rows once")


class MuonAdamW(torch.optim.Optimizer):
    """Muon's matrices (``hidden_matrices``) and AdamW's parameters, each group marked by ``kind`` (muon | adamw) and
    its schedule's ``peak_lr`` / ``min_lr`` (the trainer sets ``lr`` every step from them)."""

    def __init__(self, adamw_groups: list[dict], muon_params: list[nn.Parameter], matrices: list[Matrix],
                 muon: dict, adamw: dict) -> None:  # fmt: skip
        # torch's AdamW holds the AdamW groups; this optimizer shares the very dicts and its state (``link``)
        self.adamw = torch.optim.AdamW([{**g, "kind": "adamw"} for g in adamw_groups], **adamw)
        groups = [*self.adamw.param_groups, {"params": muon_params, "kind": "muon", **muon}]
        super().__init__(groups, {"lr": muon["lr"]})
        self.link()
        by_shape: dict[tuple[int, int], list[Matrix]] = defaultdict(list)
        for matrix in matrices:
            by_shape[matrix.shape].append(matrix)
        self.by_shape = dict(by_shape)  # matrices of one shape are orthogonalised in one batch

    def link(self) -> None:
        """AdamW's groups and state are this optimizer's (again after ``load_state_dict``, which makes new ones)."""
        self.adamw.param_groups = [g for g in self.param_groups if g["kind"] == "adamw"]
        self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self.muon_step(group)
        return loss

    def muon_step(self, group: dict) -> None:
        """Momentum per weight (``torch.optim.Muon``'s: an average, Nesterov's look-ahead), each matrix's update
        orthogonalised, the weights decayed, then moved by their matrix's adjusted learning rate."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        grads, bufs = [p.grad for p in params], [self.state[p]["momentum_buffer"] for p in params]
        momentum, lr = group["momentum"], group["lr"]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)  # one kernel for all the weights, not one each
        updates = dict(zip(params, torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs))
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        for (rows, cols), matrices in self.by_shape.items():
            ready = [m for m in matrices if all(piece.param in updates for piece in m.pieces)]
            if not ready:
                continue
            orthogonal = newton_schulz(torch.stack([m.gather(updates) for m in ready]), group["ns_steps"],
                                       getattr(torch, group["ns_dtype"]))
            weights, steps = zip(*(pair for matrix, update in zip(ready, orthogonal) for pair in matrix.pairs(update)))
            torch._foreach_add_(list(weights), list(steps), alpha=-adjusted_lr(lr, group["adjust_lr"], rows, cols))


def check_split(split: str, layer_layouts: list[tuple[type, object]]) -> None:
    """Refuse, before any work, a split that a layer's class cannot make (``matrix_rows`` None): from the model's
    config (``GPTConfig.layer_layouts``: each layer's class and spec), naming the layers."""
    if split == "as_stored":
        return
    unsaid = [i for i, (layout, spec) in enumerate(layer_layouts) if layout.matrix_rows(spec) is None]
    if unsaid:
        names = sorted({layer_layouts[i][0].name for i in unsaid})
        raise ValueError(f"optim.muon_split={split} orthogonalises each projection{' and head' * (split == 'heads')} "
                         f"apart, but attention={', '.join(names)} (layers {', '.join(map(str, unsaid))}) does not say "
                         f"how its weights split (its class's matrix_rows); use optim.muon_split=as_stored")


def muon_adamw(model: nn.Module, cfg, fused: bool, dtype: torch.dtype = torch.float32) -> MuonAdamW:
    """``optim=muon`` for ``model``: its hidden matrices split as ``cfg.muon_split`` says, orthogonalised in bfloat16
    for a run in a half-precision ``dtype`` and in float32 for one in float32; the rest AdamW (weight decay on its
    matmul weights only, as ``optim=adamw``'s). Refuses a model with no hidden matrix."""
    matrices = hidden_matrices(model, cfg.muon_split)
    if not matrices:
        raise ValueError("optim=muon orthogonalises a model's 2-D hidden weights, and this model has none (only "
                         "embeddings, norms, biases or scalars); use optim=adamw")  # fmt: skip
    muon_ids = {id(piece.param) for m in matrices for piece in m.pieces}
    embeddings = embedding_ids(model)
    muon_params, decay, no_decay = [], [], []
    for param in model.parameters():  # unique parameters: the tied LM head is the embedding
        if not param.requires_grad:
            continue
        if id(param) in muon_ids:
            muon_params.append(param)
        else:
            (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    schedule = {"min_lr": cfg.min_lr, "peak_lr": cfg.lr}
    adamw_groups = [{"params": params, "weight_decay": wd, **schedule}
                    for params, wd in ((decay, cfg.weight_decay), (no_decay, 0.0)) if params]  # fmt: skip
    muon = {"lr": cfg.muon_lr, "peak_lr": cfg.muon_lr, "min_lr": cfg.muon_lr * cfg.min_lr / cfg.lr,
            "momentum": cfg.muon_momentum, "nesterov": cfg.muon_nesterov, "ns_steps": cfg.muon_ns_steps,
            "adjust_lr": cfg.muon_adjust_lr, "weight_decay": cfg.muon_weight_decay, "split": cfg.muon_split,
            "ns_dtype": "float32" if dtype == torch.float32 else "bfloat16"}
    adamw = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "fused": fused}
    return MuonAdamW(adamw_groups, muon_params, matrices, muon, adamw)

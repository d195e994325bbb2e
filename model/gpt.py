"""The GPT: embeddings -> N x (LN -> attention -> LN -> MLP) -> LN -> logits."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.attention.pipeline import attention_of, own_draws
from model.attention.positions import build_positions
from model.checkpoints.convert import convert_attention_layout, detect_attention_layout, initial_form
from model.chunked_loss import head_loss, token_losses
from model.config import GPTConfig
from model.decoding.kv_cache import KVCache, LayerCache  # KVCache is imported from here too

# Tokens a reading of a PaTH model (``GPT.read_states``) puts through its KV cache at a time, past two of them: its
# widened keys are d + this wide instead of d + the sequence's length
TURNED_KEYS_CHUNK = 256


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU, so its weights load exactly
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        """``config``: this layer's model as a uniform one (``GPTConfig.layer_config``)."""
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = attention_block(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, cache: LayerCache | None = None,
        document_starts: torch.Tensor | None = None, shared: dict | None = None,
    ) -> torch.Tensor:
        """``shared``: cross-layer KV sharing's hand-over of keys and values (``MultiHeadAttention.attend``), for a
        layer that others read or one that reads."""
        extra = {} if shared is None else {"shared": shared}  # only softmax layouts take it (check_kv_sharing)
        x = x + self.attn(self.ln_1(x), positions, cache, document_starts, **extra)
        return x + self.mlp(self.ln_2(x))


def attention_block(config: GPTConfig) -> nn.Module:
    """The layout's attention block, built so that the random generator ends where building the block of the
    layout's initial form (``initial_form``: the canonical layout, in which ``GPT.reset_parameters`` draws)
    leaves it: what a layout draws while it is built (its Linears' own init, any number of its own) is thrown
    away, so the draws after it, the initial weights among them, never depend on how a layout is built."""
    form = initial_form(config.attention)
    if form == config.attention:
        return attention_of(config.attention, config.attention_spec)
    with own_draws():
        block = attention_of(config.attention, config.attention_spec)
    attention_of(form, config.attention_spec)  # the form's draws, as if it had been built; the block is dropped
    return block


def score_flops(layout: type, spec, seq_len: int) -> int:
    """Training FLOPs per token of one layer's mixing of tokens (``MultiHeadAttention.mixing_flops``): softmax
    attention's score and value matmuls, a linear layer's state."""
    return layout.mixing_flops(spec, seq_len)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.document_masking and config.document_end is None:
            raise ValueError("model.document_masking=true needs the token that ends a document: model.document_end="
                             "<its id> (training fills in the tokenizer's end-of-text; a GPTConfig built by hand "
                             "says it)")  # fmt: skip
        if config.layer_pattern is None and config.kv_from is not None:
            raise ValueError(f"model.kv_from={config.kv_from!r} makes a layer read an earlier layer's keys and values, "
                             f"but every layer is alike: set it on a layer kind of a schedule "
                             f"(model.layer_pattern=GS '+model.layer_kinds.G={{}}' +model.layer_kinds.S.kv_from=G: "
                             f"quoted, as a shell may read braces), or leave it unset")  # fmt: skip
        self.config = config
        # Cross-layer KV sharing: each layer's source of keys and values (None: its own), asked once
        self.kv_sources = config.kv_sources
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=build_positions(config),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(Block(config.layer_config(i)) for i in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying
        self.cache_capacities = config.cache_capacities  # each layer's, asked once: a decode step reads them
        # whether some layer's position encoding turns the keys for each query (PaTH): asked once, read_states reads it
        self.turns_keys = any(registry.position(config.layer_config(i).position).transforms_keys
                              for i in range(config.n_layer))  # fmt: skip
        # Tokens per chunk of the LM head and loss computed together (model/chunked_loss.py; the trainer's
        # trainer.loss_chunk); 0: the whole (B, T, V) logits at once
        self.loss_chunk = 0
        # Sparse attention's indexers (model.attention.sparse), each layer's; the mean of their last KL, for the logs
        self.indexers = [block.attn.indexer for block in self.transformer.h if getattr(block.attn, "indexer", None)]
        self.indexer_kl: torch.Tensor | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation, drawn in one canonical order whatever the layout.

        Every random tensor is drawn in the canonical layout's form (the fused one:
        ``model.registry.canonical_layout``), in sorted name
        order, then converted to this model's layout: for a seed, all layouts
        start from exactly the same weights, so their losses differ only by
        arithmetic order; sparse attention's indexers are drawn after everything else, so the rest starts as the dense
        model's. Weights ~ N(0, 0.02); the projections that write into
        the residual stream (``c_proj``) get 0.02 / sqrt(2 * n_layer); biases 0, norms 1, sinks 0.
        """
        form = initial_form(self.config.attention)  # the canonical layout; attention=mla's own (another function)
        canonical = _as_layout(self.state_dict(), self.config.attention, form, self.config.n_head)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        starts = {f".{name}": value for mod in registry.MODIFICATIONS.values()  # QK-norm's scales 1, sinks 0
                  for name, value in mod.initial_values(self.config.n_head).items()}  # fmt: skip
        layouts = dict.fromkeys(layout for layout, _ in self.config.layer_layouts)
        owns = [layout.initial_tensor for layout in layouts if hasattr(layout, "initial_tensor")]  # gated_deltanet's
        drawn: dict[str, torch.Tensor] = {}
        # sparse attention's indexers last: the rest of the model starts as the same model without them does
        for name in sorted(canonical, key=lambda name: (is_indexer(name), name)):
            template = canonical[name]
            start = next((value for ending, value in starts.items() if name.endswith(ending)), None)
            if name == "lm_head.weight":
                continue  # tied to the token embedding
            special = next((t for t in (draw(name, template) for draw in owns) if t is not None), None)
            if special is not None:  # a layout's own rule (a linear layer's decay and convolution)
                drawn[name] = special
            elif template.dim() == 2:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                drawn[name] = torch.empty_like(template).normal_(0.0, std)
            elif start is not None:
                drawn[name] = torch.full_like(template, start)
            elif (".ln_" in name or "_norm." in name) and name.endswith(".weight"):  # LayerNorm, a latent's RMSNorm
                drawn[name] = torch.ones_like(template)
            else:
                drawn[name] = torch.zeros_like(template)
        drawn["lm_head.weight"] = drawn["transformer.wte.weight"]
        self.load_weights(drawn)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits over the real vocabulary (padding cropped) and the loss.

        Without targets only the last position's logits are computed (B, 1, V).
        Targets of -1 are ignored by the loss. With a ``cache``, ``idx`` holds the
        positions after those already cached, and the cache is extended by them.
        With ``loss_chunk`` set, the loss comes without logits (None): none were kept.
        """
        x = self.hidden_states(idx, cache)
        if targets is None:
            h = self.transformer.ln_f(x[:, -1, :])
            return self.lm_head(h).unsqueeze(1)[..., : self.config.vocab_size], None
        return self.logits_and_loss(x, targets)

    def hidden_states(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) token ids -> the last block's (B, T, C) output (before the final norm); extends ``cache``."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, seq) token ids, got shape {tuple(idx.shape)}")
        positions = self.positions_of(idx, cache)
        starts = self.document_starts(idx, positions, cache) if self.config.document_masking else None
        x = self.transformer.wte(idx)
        # the learned table's vectors (None for the others): with document_positions, of each token's place in its
        # document, (B, T)
        added = self.transformer.wpe.to_add(positions - starts if self.config.document_positions else positions)
        x = self.transformer.drop(x if added is None else x + added)
        # cross-layer KV sharing: a read layer's keys and values, handed to the layers that read them (by key group)
        shared = {j: {} for j in self.kv_sources if j is not None}
        for i, block in enumerate(self.transformer.h):
            source = self.kv_sources[i]
            x = block(x, positions, cache.layers[i] if cache is not None else None, starts,
                      shared.get(i) if source is None else shared[source])  # fmt: skip
        if cache is not None:
            cache.advance(idx.size(1))
        return x

    def document_starts(self, idx: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """(B, T): the absolute position where each token's document starts (document masking), the position after
        the last end-of-text token (``config.document_end``) before it, among these tokens or, with a ``cache``, those
        before them (the cache carries it); 0 where there is none. An end-of-text token ends its own document."""
        ends = torch.where(idx == self.config.document_end, positions, -1)  # each end's position, -1 elsewhere
        starts = F.pad(ends[:, :-1], (1, 0), value=-1).cummax(dim=1).values + 1  # after the last end before
        if cache is None:
            return starts
        carried = cache.next_document_starts(idx.size(0), idx.device)
        starts = torch.maximum(starts, carried[:, None])
        carried.copy_(torch.maximum(carried, ends.max(dim=1).values + 1))  # the next token's, in place
        return starts

    def token_losses(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(B, T) float32: each position's cross-entropy against ``targets`` (0 where -1), without gradients, the
        logits made ``loss_chunk`` tokens at a time (all at once when it is 0)."""
        with torch.no_grad():
            h = self.transformer.ln_f(self.read_states(idx)).flatten(0, 1)
            losses = token_losses(h, self.lm_head.weight, targets.flatten(), self.config.vocab_size,
                                  self.loss_chunk or h.size(0))  # fmt: skip
        return losses.view_as(targets)

    def read_states(self, idx: torch.Tensor, chunk: int = TURNED_KEYS_CHUNK) -> torch.Tensor:
        """The last block's output for ``idx``, read without gradients (``token_losses``: evaluations): one forward,
        or, where some layer's position encoding turns the keys for each query (PaTH, whose one forward widens every
        head's queries and keys by the sequence's length: O(T^2 (d + T)) work a head), a sequence longer than two
        ``chunk``s goes through a KV cache ``chunk`` tokens at a time (O(T^2 (d + chunk))): the same function to
        round-off, as cached decoding is. Only where every layer's cache holds every key of the sequence (no window
        or ring shorter than it: a chunk's first queries read keys up to a window before it)."""
        T = idx.size(1)
        if not self.turns_keys or T <= 2 * chunk or min(self.cache_capacities) < T:
            return self.hidden_states(idx)
        cache = KVCache(self.config.n_layer)
        return torch.cat([self.hidden_states(idx[:, i : i + chunk], cache) for i in range(0, T, chunk)], dim=1)

    def positions_of(self, idx: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """The absolute positions of ``idx``'s tokens, computed once for the embedding and every block:
        0..T-1, or after the cached ones (the cache's bookkeeping, a static decode step's tensor included)."""
        if cache is not None and cache.in_static_step:
            return cache.positions(idx.size(1), idx.device, self.cache_capacities)
        seq_len = (cache.length if cache is not None else 0) + idx.size(1)
        if seq_len > self.config.block_size and not self.config.runs_past_context:
            raise ValueError(
                f"sequence length {seq_len} exceeds block_size={self.config.block_size}; "
                f"crop the input to its last {self.config.block_size} tokens"
            )
        if cache is None:
            return torch.arange(idx.size(1), device=idx.device)
        return cache.positions(idx.size(1), idx.device, self.cache_capacities)

    def logits_and_loss(self, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The last block's output -> final norm -> logits over the real vocabulary, and the mean
        cross-entropy. Training keeps only the loss, so these (B, T, V) logits die with the step. With
        ``loss_chunk``, the head and loss a chunk of tokens at a time (``model.chunked_loss``): no logits."""
        vocab = self.config.vocab_size
        if self.loss_chunk:
            h = self.transformer.ln_f(x).flatten(0, 1)
            return None, self.with_indexer_loss(head_loss(h, self.lm_head.weight, targets.flatten(), vocab,
                                                          self.loss_chunk))  # fmt: skip
        logits = self.lm_head(self.transformer.ln_f(x))[..., :vocab]
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-1)
        return logits, self.with_indexer_loss(loss)

    def with_indexer_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` with the gradient of the sparse attention indexers' KLs (``model.attention.sparse``) added, its
        value unchanged: loss + (KL - KL), the second KL detached. So the loss logged, compared and stopped on is the
        language model's, and scaling it (gradient accumulation, fp16's scaler) scales the KL's gradient alike. The
        indexers' KLs are taken (each is one forward's); their mean per layer is ``indexer_kl``."""
        kls = [indexer.loss for indexer in self.indexers if indexer.loss is not None]
        if not kls:
            return loss
        for indexer in self.indexers:
            indexer.loss = None
        kl = torch.stack(kls).sum()
        self.indexer_kl = kl.detach() / len(kls)
        return loss + (kl - kl.detach())

    def gradient_groups(self) -> list[list[nn.Parameter]]:
        """The parameters whose gradients are clipped together: the model's, and apart from them its sparse attention
        indexers' (trained by their KL alone: its gradient must not scale the language model's update)."""
        named = list(self.named_parameters())
        groups = [[p for name, p in named if not is_indexer(name)], [p for name, p in named if is_indexer(name)]]
        return [group for group in groups if group]

    def select_sparse_keys(self, on: bool) -> None:
        """Sparse attention selects its keys (``on``), or stays dense while its indexers learn (the warm-up)."""
        for indexer in self.indexers:
            indexer.selecting = on

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, each counted once (the tied LM head is the token embedding).

        ``non_embedding=True`` leaves out the token and position embeddings.
        """
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.transformer.wte.weight.numel() + self.position_params()
        return total

    def position_params(self) -> int:
        """The learned position table's parameters (0 for an encoding without one)."""
        return sum(p.numel() for p in self.transformer.wpe.parameters())

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs (forward + backward) per token, as in the PaLM paper's appendix B.

        6 per weight that multiplies the token (all but the position embedding;
        the tied token embedding counts as the LM head's matmul) plus the attention
        score and value matmuls, 6 * n_layer * (their widths: 2 * n_embd, or the layout's ``score_widths``) *
        (keys each query sees: seq_len, or the window). Grouped-query heads shrink the key/value projections, not
        the attention matmuls.
        """
        cfg = self.config
        seq_len = cfg.block_size if seq_len is None else seq_len
        matmul_params = self.num_params() - self.position_params()
        return 6 * matmul_params + sum(score_flops(layout, spec, seq_len) for layout, spec in cfg.layer_layouts)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a GPT state dict of any attention layout, converting it to this model's.

        Missing, unexpected or wrongly shaped tensors are a ValueError that names them.
        """
        cfg = self.config
        state_dict = _as_layout(state_dict, detect_attention_layout(state_dict, like=cfg.attention), cfg.attention,
                                cfg.n_head)  # fmt: skip
        own = self.state_dict()
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"state dict does not fit this GPT: missing {missing[:5]}"
                f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                f"{'...' if len(unexpected) > 5 else ''}"
            )
        wrong = [
            f"{k}: state dict {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
            for k, v in own.items()
            if state_dict[k].shape != v.shape
        ]
        if wrong:
            raise ValueError(
                f"state dict shapes do not fit this GPT's config ({len(wrong)} tensors): " + "; ".join(wrong[:5])
            )
        self.load_state_dict(state_dict)


def is_indexer(name: str) -> bool:
    """Whether a parameter is a sparse attention indexer's (``model.attention.sparse``): drawn last, clipped apart."""
    return ".indexer." in name


def _as_layout(state_dict: Mapping[str, torch.Tensor], src: str, dst: str, n_head: int) -> dict[str, torch.Tensor]:
    return dict(state_dict) if src == dst else convert_attention_layout(state_dict, src, dst, n_head=n_head)

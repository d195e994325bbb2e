"""Position encodings: how the model knows where a token is (``model.position``).

The GPT computes its tokens' absolute positions once (0..T-1, or after the cached ones, or a static decode
step's position tensor) and gives them to the encoding's two sides:

- ``embedding``: what is added to the token embeddings (GPT-2's learned table; nothing for the others);
- ``in_attention``: what each attention block does with them (rotary turns its queries and keys; ALiBi
  biases its scores by distance; the learned table and NoPE do nothing there).

Each encoding is a class registered in ``POSITIONS`` stating its facts (whether the model runs past
``block_size``, whether GPT-2's format can hold it). A new encoding is one class here, plus the configs
value it is chosen by (``model.position``) and its tests.

- ``learned``: GPT-2's learned vector per absolute position, added to the embeddings; the model knows no
  position past ``block_size``.
- ``rope``: rotary embedding (Su et al. 2021, RoFormer): each pair of a head's query/key dimensions
  (i, i + head_dim/2, the "rotate half" pairing of GPT-NeoX and Llama) turned by position x theta^(-2i/d),
  so a query-key product depends on their distance only.
- ``alibi``: attention with linear biases (Press et al. 2022): head h adds -slope_h x distance to its
  scores, slopes a geometric sequence (``alibi_slopes``).
- ``none``: no position signal (NoPE, Kazemnejad et al. 2023): the causal mask alone orders the tokens.
- ``path``: PaTH (Yang et al. 2025, arXiv 2505.16381; flash-linear-attention's PaTHAttention): a data-dependent
  transform between each query and key, q_i^T H_i H_{i-1} ... H_{j+1} k_j, each token's H_t = I - beta_t w_t w_t^T
  (w_t = L2-normalised x_t W_w per key/value head, beta_t = 2 sigmoid(x_t w_b + b_b) in (0, 2): a reflection at 2).
  The keys carry the product: each new token's H_t turns every key held before it (``turned_through``), so a KV
  cache holds each key turned through the last token (in place) and a decode step attends q_t . k_j' with any kernel;
  a forward of T tokens widens its queries and keys by T dims so that one kernel call computes every query's own
  product (``householder_augmented``: the products' compact form, a triangular solve). Eviction from a ring drops
  a key with its product: the keys still held carry theirs, so it reads past ``block_size`` exactly.
"""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from model.attention.kernels import ordinary_tensors
from model.registry import POSITIONS, register


class LearnedPositions(nn.Embedding):
    """A learned vector per absolute position, 0 .. block_size-1, added to the token embeddings (GPT-2's).

    An ``nn.Embedding`` itself, so its weight keeps GPT-2's name (``transformer.wpe.weight``).
    """

    def __init__(self, block_size: int, n_embd: int) -> None:
        super().__init__(block_size, n_embd)

    def to_add(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) positions -> (T, n_embd): what the tokens at those positions get added; (B, T) -> (B, T, n_embd),
        each row's own (positions counted from each document's start)."""
        return self(positions)


class NothingAdded(nn.Module):
    """The embedding side of an encoding that acts in attention (or nowhere): adds nothing, holds nothing."""

    def to_add(self, positions: torch.Tensor) -> None:
        return None


class Rotary(nn.Module):
    """Rotary position embedding of queries and keys (RoFormer), the "rotate half" pairing.

    cos and sin come from the positions (no table caps the length, so generation runs past ``block_size``, and
    a static decode step's position tensor works in a captured graph), in float32 and cast to the queries'
    dtype, as Llama's and nanochat's are. One Rotary serves every layer of a model (``RotaryPositions.rotary``
    hands out one per width and theta), and in eager mode it keeps the angles of the last positions tensor it
    saw: a forward computes them once, not twice per layer (a decode step of the nano model spent 0.5 ms
    recomputing them). On a CPU they are rows of a table of every position so far (grown by doubling): a decode
    step reads two rows instead of computing a dozen small tensors, and takes them as views made ahead in one
    call for the table's first ``ROW_LIMIT`` positions (slicing the rows each step cost the nano model 5% of a
    step). Compiled code computes them in the graph.
    """

    TABLE_LIMIT = 1 << 16  # positions a table may cover; past it (a very long generation) angles are computed
    ROW_LIMIT = 1 << 12  # positions whose single rows are made ahead for decode steps (a few MB of views at most)

    def __init__(self, dim: int, theta: float, scaling: str | None = None, factor: float = 1.0,
                 original: int | None = None) -> None:  # fmt: skip
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary positions turn pairs of dimensions: the head dim {dim} is odd; choose "
                             f"n_embd / n_head even")  # fmt: skip
        self.dim, self.theta = dim, theta
        self.scaling, self.factor, self.original = scaling, factor, original  # see ``scaled``
        # (positions, {dtype: (cos, sin)}): a forward's positions tensor is made once and never written (a static
        # step's is a fresh view of its position each step), so the same object means the same positions.
        self._last: tuple | None = None
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # angles of positions 0..n-1, on the CPU
        self._rows: dict[tuple, tuple[tuple, tuple]] = {}  # (dtype, time_dim) -> each position's (cos, sin) views
        self._frequencies: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # see ``frequencies``

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) positions -> cos and the signed sin, each (T, dim) in float32: the angle of pair i for both
        halves, the sin negated in the first half (where rotate-half takes the negated second half). The
        frequencies are made here (a buffer would be cast with the model's weights to bf16)."""
        inverse, sign = self.frequencies(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inverse  # over both halves: the same elements, one path
        cos = freqs.cos() if self.scaling != "yarn" else freqs.cos() * sign.abs()  # YaRN's temperature on cos too
        return cos, freqs.sin() * sign  # x * -1 is -x exactly

    def frequencies(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """theta^(-2i/dim) for pair i, repeated for both halves, and rotate-half's sign (-1 on the first half, 1
        on the second), made once per device: a GPU decode step computes its angles, in a few kernels."""
        if torch.compiler.is_compiling():
            return self.made_frequencies(device)
        if device not in self._frequencies:
            with ordinary_tensors():  # kept: made while sampling, read by a later training step too
                self._frequencies[device] = self.made_frequencies(device)
        return self._frequencies[device]

    def made_frequencies(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        sign = torch.ones(self.dim, device=device)
        sign[: self.dim // 2] = -1.0
        if self.scaling is None:
            pairs = torch.arange(0, self.dim, 2, dtype=torch.float32, device=device)
            return (self.theta ** -(pairs / self.dim)).repeat(2), sign
        inverse, temperature = scaled(self.dim, self.theta, self.scaling, self.factor, self.original)
        # YaRN's temperature scales both cos and sin: the queries and keys each by sqrt(1/t), the scores by 1/t
        return inverse.to(torch.float32).to(device).repeat(2), sign * temperature

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, time_dim: int = -2) -> tuple[torch.Tensor, ...]:
        """``angles`` cast to ``dtype`` and shaped to broadcast over (..., T, dim) (``time_dim=-2``) or
        (..., T, heads, dim) (``-3``), reused while the same positions tensor comes back (eager mode)."""
        if torch.compiler.is_compiling():
            return tuple(t.to(dtype).unsqueeze(-2) if time_dim == -3 else t.to(dtype) for t in self.angles(positions))
        last = self._last
        if last is None or last[0] is not positions:
            last = self._last = (positions, {})
        key = (dtype, time_dim)
        if key not in last[1]:
            row = self.step_row(positions, key) if positions.numel() == 1 else None
            last[1][key] = row or self.shaped(self.looked_up(positions), key)
        return last[1][key]

    @staticmethod
    def shaped(cos_sin: tuple[torch.Tensor, torch.Tensor], key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (T, dim) angles -> in ``key``'s (dtype, time_dim): cast, and (T, 1, dim) for time_dim -3."""
        dtype, time_dim = key
        cast = cos_sin if dtype == torch.float32 else tuple(t.to(dtype) for t in cos_sin)
        return tuple(t.unsqueeze(-2) for t in cast) if time_dim == -3 else cast

    def step_row(self, positions: torch.Tensor, key: tuple) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step's one position: its (cos, sin) as views made ahead for the table's first positions, or
        None (a GPU, or past ``ROW_LIMIT``)."""
        if positions.device.type != "cpu":
            return None
        position = positions.tolist()[0]
        rows = self._rows.get(key)
        if rows is None or position >= len(rows[0]):
            if position >= self.ROW_LIMIT:
                return None
            self.looked_up(positions)  # the table grows to cover the position
            covered = min(self._table[0].size(0), self.ROW_LIMIT)
            with ordinary_tensors():
                rows = self._rows[key] = tuple(t.unsqueeze(1).unbind(0) for t in self.shaped(
                    tuple(t[:covered] for t in self._table), key))  # fmt: skip
        return rows[0][position], rows[1][position]

    def looked_up(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``angles(positions)``, as rows of the table on a CPU (where reading the last position waits for
        nothing; on a GPU it would wait for the device, so there they are computed)."""
        if positions.device.type != "cpu" or positions.numel() == 0:
            return self.angles(positions)
        where = positions.tolist()  # one read of a few numbers, cheaper than a max() and two gathers per forward
        first, count, needed = where[0], len(where), max(where) + 1
        if self._table is None or self._table[0].size(0) < needed:
            if needed > self.TABLE_LIMIT:
                return self.angles(positions)
            size = max(256, needed, 2 * (0 if self._table is None else self._table[0].size(0)))
            with ordinary_tensors():  # built while sampling (inference mode), read by a later training step too
                self._table = self.angles(torch.arange(min(size, self.TABLE_LIMIT)))
        if needed == first + count and where == list(range(first, needed)):  # a run: every forward's, every step's
            return tuple(t[first:needed] for t in self._table)  # views of the table's rows
        return tuple(t.index_select(0, positions) for t in self._table)

    def forward(self, t: torch.Tensor, positions: torch.Tensor, time_dim: int = -2) -> torch.Tensor:
        """(..., T, dim) queries or keys at ``positions`` (T,) -> turned by their positions. ``time_dim=-3``
        takes (..., T, heads, dim): the queries and keys of every head turned in one call, the same numbers.
        Wider than ``dim`` (a head whose first ``dim`` dims rotate, GPT-NeoX's and Qwen3-Next's partial
        rotary), the rest of each head passes unchanged."""
        if time_dim not in (-2, -3):
            raise ValueError(f"time_dim={time_dim}: the positions are dim -2 (..., T, dim) or -3 (..., T, heads, dim)")
        if t.size(-1) != self.dim:  # partial rotary (model.rope_fraction): the first dim dims turn, the rest pass
            turned = self.forward(t[..., : self.dim], positions, time_dim)
            return torch.cat((turned, t[..., self.dim :]), dim=-1)
        cos, signed_sin = self.cos_sin(positions, t.dtype, time_dim)
        # rotate-half, (x1, x2) -> (-x2, x1), with the sign kept in the sin: no negation per call, and the same
        # numbers ((-x2) * sin is x2 * (-sin), bit for bit). The halves swap in one call (a roll by half the
        # width: one op where slicing and joining took three, half the time in a decode step and in backward).
        return t * cos + t.roll(t.size(-1) // 2, -1) * signed_sin


ROPE_SCALINGS = ("pi", "ntk", "yarn")  # model.rope_scaling: rotary read past the length it was trained at
YARN_ALPHA, YARN_BETA = 1.0, 32.0  # YaRN's ramp: pairs turning fewer than alpha / more than beta times in it


def scaled(dim: int, theta: float, scaling: str, factor: float, original: int | None) -> tuple[torch.Tensor, float]:
    """Each pair's inverse wavelength (dim / 2, float64) under a rotary scaling by ``factor`` s, and YaRN's
    temperature factor (1 for the others):

    - ``pi``, position interpolation (Chen et al. 2023): positions divided by s, i.e. every frequency by s;
    - ``ntk``, NTK-aware (bloc97 2023): the base raised to theta * s^(dim / (dim - 2)), positions as they are;
    - ``yarn`` (Peng et al. 2023, eq. 17-18 and 22): pair i, turning r = L / lambda_i times over the trained
      length L (``original``), keeps (1 - gamma) / s + gamma of its frequency, gamma = 0 for r < alpha, 1 for
      r > beta, linear between (alpha 1, beta 32); the scores are scaled by 1/t, sqrt(1/t) = 0.1 ln s + 1.
    """
    pairs = torch.arange(0, dim, 2, dtype=torch.float64)
    if scaling == "ntk":  # one pair (dim 2: a sparse indexer's narrowest rotary) turns at theta^0 = 1 at any base
        return (theta * factor ** (dim / (dim - 2))) ** -(pairs / dim) if dim > 2 else torch.ones(1), 1.0
    inverse = theta ** -(pairs / dim)
    if scaling == "pi":
        return inverse / factor, 1.0
    turns = original * inverse / (2 * math.pi)  # r = L / lambda, lambda = 2 pi / frequency
    gamma = ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
    return inverse * ((1 - gamma) / factor + gamma), 0.1 * math.log(factor) + 1.0


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022): for a power of two n, 2^(-8/n), 2^(-16/n), ..., 2^(-8);
    otherwise the slopes of the nearest lower power of two, then every other slope of the next one (the
    paper's code)."""
    def geometric(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    lower = 2 ** math.floor(math.log2(n_head))
    slopes = geometric(lower)
    if lower < n_head:
        slopes += geometric(2 * lower)[0::2][: n_head - lower]
    return torch.tensor(slopes, dtype=torch.float32)


class PositionEncoding:
    """An encoding's facts and its two sides (see the module's docstring)."""

    name: ClassVar[str]
    label: ClassVar[str | None] = None  # its part of a run's label (attention_label), when not its name
    runs_past_context: ClassVar[bool] = True  # attends by distance or not at all: no table to run out of
    in_gpt2: ClassVar[bool] = False  # GPT-2's format (export) holds it
    biases_scores: ClassVar[bool] = False  # adds to the attention scores (a kernel must take a score bias)
    turns_queries_keys: ClassVar[bool] = False  # rotates queries and keys (the head dim must be even)
    # reads each token's own position (a table), not the distance between a query and a key: where positions restart
    # per document (model.document_positions), what it adds changes; a distance within a document does not
    absolute: ClassVar[bool] = False
    # The attention options it consumes (model.attention.options): a layer that applies positions applies them with it
    fields: ClassVar[tuple[str, ...]] = ()
    # turns the keys by transforms from the tokens between a key and its query (PaTH): each query sees keys of its own,
    # so the pipeline runs its kernel once per query, and a KV cache's keys are turned in place by each new token
    transforms_keys: ClassVar[bool] = False
    # the plan's terms it changes beside no positions (model.attention.options.PLAN_TERMS; tests/test_plan_terms.py)
    plan: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def refusal(cls, layer, spec) -> str | None:
        """Why a layer of class ``layer`` (that applies positions) cannot hold this encoding with ``spec``: one line
        naming the fix, or None (asked by ``model.attention.options.check_applied``, which every layer's check
        calls)."""
        return None

    @classmethod
    def embedding(cls, block_size: int, n_embd: int) -> nn.Module:
        """The module added to the token embeddings (``transformer.wpe``): its ``to_add(positions)``."""
        return NothingAdded()

    @classmethod
    def rotary(cls, dim: int, theta: float, **scaling) -> Rotary | None:
        """The rotation of a head's queries and keys of ``dim`` dims (``scaling``: Rotary's scaling, factor and
        original length), or None."""
        return None


@register(POSITIONS)
class Learned(PositionEncoding):
    name = "learned"
    plan = ("parameters",)  # its table
    runs_past_context = False
    in_gpt2 = True
    absolute = True

    @classmethod
    def embedding(cls, block_size: int, n_embd: int) -> nn.Module:
        return LearnedPositions(block_size, n_embd)


@register(POSITIONS)
class RotaryPositions(PositionEncoding):
    name = "rope"
    plan = ("activations",)  # what rotary keeps of the queries and keys
    turns_queries_keys = True
    fields = ("rope_theta", "rope_fraction", "rope_scaling", "rope_factor", "rope_original_length")

    @classmethod
    def rotary(cls, dim: int, theta: float, **scaling) -> Rotary:
        return shared_rotary(dim, theta, **scaling)


@register(POSITIONS)
class ALiBi(PositionEncoding):
    name = "alibi"
    biases_scores = True


@register(POSITIONS)
class NoPositions(PositionEncoding):
    name, label = "none", "nopos"  # "-none" would read as no option at all


@register(POSITIONS)
class PaTHPositions(PositionEncoding):
    """PaTH's accumulated Householder transforms (see the module's docstring); its projections (w, beta) are the
    ``path`` modification's (``model.attention.modifications``), the turned keys ``turned_through``'s and
    ``householder_augmented``'s."""

    name = "path"
    plan = ("parameters", "activations")  # its projections; the widened queries and keys, the solve's terms
    transforms_keys = True

    @classmethod
    def refusal(cls, layer, spec) -> str | None:
        """A layer whose KV cache holds what its keys are made from (MLA's latent, up-projected after the cache: the
        keys a new token turns are not held), and sparse attention (its indexer learns from the layer's attention
        weights, which PaTH forms per query from keys turned for it), are refused."""
        if not layer.takes_kernel:
            return None
        if not layer.caches_keys:
            return (f"model.position={spec.position} turns the keys a KV cache holds by each new token, but "
                    f"attention={layer.name} caches what its keys are made from ({layer.computes}); use a layout "
                    f"that caches its keys (attention=separate_qkv), or another model.position")  # fmt: skip
        if spec.sparse_topk is not None:
            return (f"model.position={spec.position} and model.sparse_topk={spec.sparse_topk} cannot both be set: "
                    f"the indexer learns from the layer's attention weights, which PaTH forms per query from keys "
                    f"turned for it; set model.sparse_topk=null, or another model.position")  # fmt: skip
        if getattr(spec, "moba_block", None) is not None:
            return (f"model.position={spec.position} and model.moba_block={spec.moba_block} cannot both be set: "
                    f"MoBA chooses blocks by q . mean(K), and PaTH turns every key for each query apart; set "
                    f"model.moba_block=null, or another model.position")  # fmt: skip
        return None


def turned_through(k: torch.Tensor, held: torch.Tensor, queries: torch.Tensor, w: torch.Tensor,
                   beta: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """PaTH's keys as a KV cache holds them after new tokens: ``k`` (B, kv, S, d) the keys at positions ``held`` (S,)
    (one before the new tokens already turned through the last token before them; a new one as projected), each
    turned by every new token after it, in order: token t (at ``queries[t]``, direction ``w`` (B, kv, T, d), strength
    ``beta`` (B, kv, T)) applies H_t = I - beta_t w_t w_t^T to the keys before it. In float32 (a bf16 product would
    round at every token), cast back to ``k``'s dtype."""
    keys = k.float()
    for t in range(queries.size(0)):
        before = (held < queries[t]).to(keys.dtype)[:, None]  # (S, 1): the keys at positions before token t
        direction = w[:, :, t, None, :].float()  # (B, kv, 1, d)
        along = (keys * direction).sum(-1, keepdim=True) * before  # each key's component along w_t
        keys = keys - beta[:, :, t, None, None].float() * along * direction
    return keys.to(k.dtype)


def householder_augmented(q: torch.Tensor, k: torch.Tensor, held: torch.Tensor, queries: torch.Tensor,
                          w: torch.Tensor, beta: torch.Tensor, w_q: torch.Tensor, beta_q: torch.Tensor,
                          width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """PaTH's logits of T new queries as one dot product: queries and keys widened by T dims so that any kernel's
    q~_i . k~_j / sqrt(d + T) is q_i^T H_i ... H_{j+1} k_j / sqrt(d), with the products of the new tokens' transforms
    in their compact (UT) form (the paper's section 3.2) instead of a key per query.

    ``q`` (B, h, T, d) at positions ``queries`` (T,); ``k`` (B, kv, S, d) at ``held`` (S,), turned as a cache holds
    them (``turned_through``); ``w``, ``beta`` (B, kv, T, d), (B, kv, T): the new tokens'; ``w_q``, ``beta_q``: the
    same for the key/value head each query head reads. With u_is = H_{s+1} ... H_i q_i (H symmetric) and
    a_is = w_s . u_is, u_{i,s-1} = u_is - beta_s a_is w_s, so
        logit_ij = q_i . k_j - sum over new s, j < s <= i, of beta_s a_is (w_s . k_j),
        a_ij = w_j . q_i - sum over j < s <= i of beta_s a_is (w_j . w_s):
    for every query at once a unit upper-triangular solve, M a = (w . q masked to s <= i), M_js = [s > j] beta_s
    w_j . w_s + [s = j] (its leading block is the system of a query's own tokens). Then q~_i = (q_i, -beta_s a_is)_s
    and k~_j = (k_j, [s > j] w_s . k_j)_s, the queries scaled by sqrt((d + T) / d) for the kernel's 1 / sqrt(d + T).
    O(T^2 (d + T)) work and O(T^2) memory per head, in float32, cast back. ``width``: both widened further with zeros
    to that many dims (at least d + T; the scale follows it), for a kernel that compiles a graph per head width."""
    T, d = q.size(-2), q.size(-1)
    ones = torch.ones(T, T, dtype=torch.bool, device=q.device)
    qf, w_q = q.float(), w_q.float()
    later = (w_q @ w_q.transpose(-1, -2)) * beta_q.float()[..., None, :] * ones.triu(1)  # [s > j] beta_s w_j . w_s
    system = later + torch.eye(T, device=q.device)
    reached = (w_q @ qf.transpose(-1, -2)) * ones.triu()  # (B, h, T_s, T_i): w_s . q_i for s <= i
    a = torch.linalg.solve_triangular(system, reached, upper=True, unitriangular=True)  # a[s, i] = a_is
    weights = (beta_q.float()[..., :, None] * a).transpose(-1, -2)  # (B, h, T_i, T_s): beta_s a_is
    after = (queries[:, None] > held[None, :]).to(torch.float32)  # (T_s, S): token s comes after key j
    along = (w.float() @ k.float().transpose(-1, -2)) * after  # (B, kv, T_s, S): [s > j] w_s . k_j
    pad = 0 if width is None else width - d - T  # zero dims: no dot product changes
    widened = math.sqrt((d + T + pad) / d)
    return (F.pad(torch.cat((qf, -weights), dim=-1), (0, pad)) * widened).to(q.dtype), \
        F.pad(torch.cat((k.float(), along.transpose(-1, -2)), dim=-1), (0, pad)).to(k.dtype)  # fmt: skip


@functools.cache
def shared_rotary(dim: int, theta: float, scaling: str | None = None, factor: float = 1.0,
                  original: int | None = None) -> Rotary:  # fmt: skip
    """One Rotary per (width, theta, scaling): every layer of a model (and every model) shares it; it holds no
    weights."""
    return Rotary(dim, theta, scaling, factor, original)


def build_positions(config) -> nn.Module:
    """The embedding side of a model config's encoding (``transformer.wpe``)."""
    return POSITIONS[config.position].embedding(config.block_size, config.n_embd)

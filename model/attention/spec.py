"""AttentionSpec: one attention block's shape and how it attends, the one place its options are declared and checked.

An option (``option(...)``) states its default, a value that sets it, the values of a choice, what it needs, the
options it cannot coexist with, whether a layer kind may set it and whether a run's label spells it: the option walks
(tests/test_options.py, tests/test_option_pairs.py) read these declarations, so a new option is walked with no test
edit. Which layer applies an option is said by the layers (``model.attention.options``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from model import registry
from model.attention.blocks import MOBA_TOPK
from model.attention.compressed import COMPRESS_WINDOW, COMPRESSED
from model.attention.differential import LAMBDA_INIT
from model.attention.kernels import SDPA_BACKENDS, get_kernel
from model.attention.label_parts import DIFFERENTIAL, KV_HEADS, MOBA, NSA, POSITION, SPARSE, LabelPart
from model.attention.masks import Masks
from model.attention.masks import of_spec as masks_of
from model.attention.masks import options_set as masks_set
from model.attention.modifications import GATES, finite_number
from model.attention.nsa import NSA_TOPK, NSA_WINDOW
from model.attention.options import EXCLUSIVE, MIXER_STAGES, PLAN_TERMS, STAGES, check_conflicts, spelled
from model.attention.positions import ROPE_SCALINGS
from model.attention.sparse import INDEXER_DIM, INDEXER_HEADS
from model.registry import KERNELS, MODIFICATIONS, POSITIONS, SELECTIONS, lookup


def option(default, example, same_function: bool = False, per_layer: bool = True, labelled: bool = True,
           values: tuple = (), conflicts: dict[str, str] | None = None, plan: tuple[str, ...] = (),
           stage: str | None = None, exclusive: str | None = None, *, reuse: str, label: LabelPart | None = None,
           key_side: bool = False, gpt2: bool = False, bench: str | None = None, **needs):  # fmt: skip
    """An option of ``AttentionSpec``: its default, a value that sets it (with the other options it ``needs``), the
    other ``values`` that set it to another function (each of a choice: rotary and no positions beside ALiBi; the
    option walks set each), whether every value computes the same function (a chunk size of an algorithm), whether a
    schedule's layer kind may set it for its layers (``model.config.LAYER_FIELDS``; not a model-wide setting: the
    rotary scaling a reading applies, dropout, a layout's own widths), and whether a run's label spells it
    (``attention_label``: two runs that differ in it must not share a name; not dropout, a training setting), and
    the options it cannot coexist with, each with why (``conflicts``: refused in one line naming both, whichever is
    set first; the pair walk, tests/test_option_pairs.py, holds every other pair to change the function), and the
    plan's terms it changes in a layer that applies it (``plan``, of ``PLAN_TERMS``: tests/test_plan_terms.py holds it
    to change those and no other); the stage that applies it (``stage``: of the pipeline's ``STAGES``, then every
    pipeline layer applies it; of a family of mixers' ``MIXER_STAGES``, every mixer that runs it; None: a projection's,
    a position encoding's or one mixer's own option), and the job within it that
    one option at a time does (``exclusive``, of ``EXCLUSIVE``: two query scalings, two selections of keys; the pair
    walk holds every two options of one job to be refused as a pair, so each declares its conflict with the other).

    And what the rest of the house reads of it, so that a new option is one declaration: what a change of it means
    to a checkpoint reused by a resume or an init_from (``reuse``: weights, function, implementation, training, ...;
    training/reuse.py), the part of a run's label that spells it (``label``, ``model.attention.label_parts``; None:
    another option's part spells it, or ``labelled`` is False), whether a layer that reads another's keys and values
    (``kv_from``) must share it with that layer (``key_side``: it shapes or encodes the keys), whether GPT-2's
    format holds it (``gpt2``: the export writes it as GPT-2's function), and bench.py's axis of it (``bench``: its
    help; the flag is ``--<name>``, its values off/on, or none and numbers, as the option's type says).
    ``model.config.GPTConfig`` takes every option as a field of its own from this declaration."""
    unknown = set(plan) - set(PLAN_TERMS)
    assert not unknown, f"plan terms {sorted(unknown)} are none of {PLAN_TERMS}"
    assert stage is None or stage in STAGES + MIXER_STAGES, f"stage {stage!r} is none of {STAGES + MIXER_STAGES}"
    assert exclusive is None or exclusive in EXCLUSIVE, f"exclusive job {exclusive!r} is none of {sorted(EXCLUSIVE)}"
    return field(default=default, metadata={"example": example, "values": values, "with": needs,
                                            "same_function": same_function, "per_layer": per_layer,
                                            "labelled": labelled, "conflicts": conflicts or {},
                                            "plan": tuple(plan), "stage": stage,
                                            "exclusive": exclusive, "reuse": reuse, "label": label,
                                            "key_side": key_side, "gpt2": gpt2, "bench": bench})  # fmt: skip


@dataclass(frozen=True)
class AttentionSpec:
    """One attention block's shape and how it attends: what every layout is built from, and the one place
    its options are checked (a GPTConfig makes one: ``GPTConfig.attention_spec``)."""

    n_embd: int
    n_head: int
    kernel: str = "sdpa"
    # The options (model.attention.options: every field but the shape and the kernel's choice) say a value that sets
    # them (``example``, with the options it needs, ``with``): tests/test_options.py holds every option, in every layer,
    # kernel and the export, to be applied (it changes the function) or refused.
    dropout: float = option(0.0, 0.25, reuse="training", gpt2=True, stage="kernel", plan=("activations",),
                            per_layer=False, labelled=False)
    bias: bool = True
    # None: n_head (multi-head); 1: multi-query
    n_kv_head: int | None = option(None, 2, reuse="weights", label=KV_HEADS, key_side=True, gpt2=True, values=(1,),
                                   plan=("parameters", "cache", "activations"))
    # keys equal to values (Gemma 4's attention_k_eq_v): one key/value projection, each key/value head's values the
    # keys as projected, before QK-norm and rotary turn the keys (model.attention.layouts)
    k_eq_v: bool = option(False, True, reuse="weights", label=LabelPart("keqv", "-keqv (keys equal to values)"),
                          bench="keys equal to values: off and/or on",
                          key_side=True, gpt2=True, plan=("parameters", "cache"))
    # None: every earlier position
    window: int | None = option(None, 3, reuse="function", label=LabelPart("window", "-window<positions>"),
                                stage="key selection", plan=("flops", "cache"))
    # Llama 4's chunked attention: a query sees the keys of its own chunk of this many positions; None: off
    attention_chunk: int | None = option(None, 3, reuse="function", label=LabelPart("chunked", "-chunked<positions>"),
                                         bench="Llama 4's chunks: positions, or none",
                                         stage="key selection", plan=("flops", "cache"))
    sdpa_backend: str = "auto"
    # model.positions: learned|rope|alibi|none|path
    position: str = option("learned", "alibi", reuse="weights", label=POSITION, key_side=True, stage="encodings",
                           values=tuple(POSITIONS))
    rope_theta: float = option(10000.0, 50.0, reuse="function", position="rope")
    # the share of each head's dims that rotary turns (the first ones; Qwen3-Next: 0.25)
    rope_fraction: float = option(1.0, 0.5, reuse="function", position="rope")
    # rotary read past its trained length: pi | ntk | yarn (model.attention.positions.scaled)
    rope_scaling: str | None = option(None, "pi", reuse="function", per_layer=False, values=ROPE_SCALINGS,
                                      position="rope", rope_factor=4.0)
    # the scaling's factor s (the read length over the trained one, typically)
    rope_factor: float = option(1.0, 4.0, reuse="function", per_layer=False, position="rope", rope_scaling="pi")
    # the trained length YaRN's ramp counts turns over (None: block_size)
    rope_original_length: int | None = option(None, 2, reuse="function", per_layer=False, position="rope",
                                              rope_scaling="yarn", rope_factor=4.0)
    # Llama 4's temperature for long contexts: the query at position i scaled by 1 + 0.1 log(1 + floor((i + 1) / N)),
    # N this many positions (Llama 4's 8192, its chunk; its NoPE layers'); None: off
    query_temperature: int | None = option(None, 4, reuse="function", stage="encodings", exclusive="query scaling",
                                           bench="Llama 4's query temperature: positions, or none",
                                           label=LabelPart("qtemp", "-qtemp<positions per step of the queries' "
                                                                    "temperature>"))  # fmt: skip
    qk_norm: bool = option(False, True, reuse="weights", key_side=True, stage="encodings",
                           plan=("parameters", "activations"))
    softcap: float | None = option(None, 3.0, reuse="function", stage="kernel")
    sinks: bool = option(False, True, reuse="weights", stage="kernel", plan=("parameters",))
    # an output gate from the block's input (GATES)
    gate: str = option("none", "headwise", reuse="weights", stage="gate", values=GATES,
                       plan=("parameters", "activations"))
    # the Forgetting Transformer's forget gate on the scores
    forget_gate: bool = option(False, True, reuse="weights", stage="kernel",
                               plan=("parameters", "cache", "activations"))
    # Differential attention (the Diff Transformer, model.differential): heads 2h and 2h+1 one head, weighted by
    # their softmax maps' difference over both heads' values, then an RMSNorm per head and the (1 - lambda_init) scale
    differential: bool = option(False, True, reuse="weights", label=DIFFERENTIAL, stage="combination",
                                bench="differential attention: off and/or on",
                                plan=("parameters", "flops", "activations"))
    # differential attention's lambda at the start (the paper's by depth tends to 0.8; its constant 0.8 did as well)
    lambda_init: float = option(LAMBDA_INIT, 0.5, reuse="function", stage="combination", differential=True)
    block_size: int | None = None  # the model's context: what a position past it sees (``context``)
    # attention=mla's latent width (a schedule's kinds may set it)
    kv_latent: int | None = option(None, 8, reuse="weights", plan=("parameters", "cache"))
    # mla's rotary key width
    rope_head_dim: int | None = option(None, 4, reuse="weights", per_layer=False, position="rope",
                                       label=LabelPart("ropedim", "-ropedim<dims>", shows_off=False))
    # attention=gated_deltanet's chunk of positions (None: its default, 64); the same function at any chunk
    linear_chunk: int | None = option(None, 3, reuse="implementation", stage="delta rule", same_function=True,
                                      per_layer=False, plan=("flops", "activations"),
                                      label=LabelPart("linchunk", "-linchunk<positions of the linear form's chunk>",
                                                      shows_off=False))  # fmt: skip
    # document masking: a query sees no key before its document's start (after the last end-of-text token)
    document_masking: bool = option(False, True, reuse="function", stage="key selection", per_layer=False,
                                    label=LabelPart("docs", "-docs (document masking)"))
    # DeepSeek Sparse Attention (model.attention.sparse): each query attends the keys a lightning indexer of this many
    # heads of this width scores highest, this many of them; None: dense. A schedule's kind may set it (a hybrid's
    # softmax layers); the indexer's shape is the model's, for every sparse layer
    sparse_topk: int | None = option(None, 2, reuse="weights", label=SPARSE, stage="key selection",
                                     bench="DeepSeek's sparse attention: keys per query, or none",
                                     exclusive="key selection", plan=("parameters", "flops", "cache", "activations"))
    indexer_heads: int = option(INDEXER_HEADS, 2, reuse="weights", stage="key selection", per_layer=False,
                                sparse_topk=2, plan=("parameters", "flops", "activations"))
    indexer_dim: int = option(INDEXER_DIM, 8, reuse="weights", stage="key selection", per_layer=False, sparse_topk=2,
                              plan=("parameters", "flops", "cache", "activations"))
    # (declared last, as each new option is: the generated grids turn layouts, kernels and windows over the entries in
    # this order, and an entry in the middle would move every later one's turns)
    # Scalable softmax (SSMax, Nakanishi 2025, arXiv 2501.19399): the query i scaled by s_h log n_i, n_i the keys it
    # sees (the masks', its document's, the KV cache's, sparse attention's selection), s_h learned per head from this
    # value (the paper's Figure 1: 0.43); None: off. Llama 4's temperature is a fixed form of the same scaling.
    ssmax: float | None = option(None, 0.43, reuse="weights", stage="encodings", exclusive="query scaling",
                                 bench="scalable softmax: its s at the start (0.43), or none",
                                 plan=("parameters",), label=LabelPart("ssmax", "-ssmax<initial s> (scalable softmax)"),
                                 conflicts={
        "query_temperature": "both scale the queries by the log of how far they read (Llama 4's temperature is a "
                             "fixed form of SSMax's learned s log n)"})
    # The delta rules' beta in (0, 2) instead of (0, 1), 2 sigmoid(W_b x): the state's transition I - beta k k^T then
    # has an eigenvalue in (-1, 1), reflecting as well as shrinking (Grazzi et al. 2025, arXiv 2411.12537; fla's
    # allow_neg_eigval, OLMo Hybrid's). Gated DeltaNet's and KDA's option: softmax attention has no beta
    negative_eigenvalues: bool = option(False, True, reuse="function", stage="delta rule",
                                        bench="the delta rules' beta in (0, 2) (gated_deltanet, kda): off and/or on",
                                        label=LabelPart("negeig", "-negeig (the delta rules' beta in (0, 2))"))
    # Mixture of Block Attention (model.attention.blocks): each query head attends its own block of this many positions
    # and the earlier blocks of highest q . mean(K_block), moba_topk blocks in all; None: off
    moba_block: int | None = option(None, 2, reuse="function", label=MOBA, stage="key selection",
                                    bench="MoBA's blocks (its top-k at model.moba_topk's 3): positions per block, "
                                          "or none",
                                    exclusive="key selection", plan=("flops",), conflicts={
        "sparse_topk": "both select the keys each query attends (MoBA blocks by q . mean(K), DeepSeek's indexer keys "
                       "by its own scores); choose one selection",
        "ssmax": "SSMax scales each query by the log of the keys it sees, which MoBA chooses from the queries "
                 "afterwards; the two are not built together"})  # fmt: skip
    # (its example with blocks of one key: then a window or a chunk of 3 and a top-k of 2 each cut what the other keeps)
    moba_topk: int = option(MOBA_TOPK, 2, reuse="function", stage="key selection", moba_block=1, plan=("flops",))
    # Native Sparse Attention (model.attention.nsa): each query head adds, gated, its attention over the compressed
    # blocks of this many positions, over its own block and the nsa_topk - 1 earlier blocks its compressed scores rank
    # highest, and over the last nsa_window keys; None: off
    nsa_block: int | None = option(None, 2, reuse="weights", label=NSA, stage="key selection",
                                   bench="NSA's blocks (its top-n and window at their defaults, 4 and 32): positions "
                                         "per block, or none",
                                   exclusive="key selection", plan=("parameters", "flops", "activations"), conflicts={
        "sparse_topk": "both select the keys each query attends (NSA blocks by its compressed keys, DeepSeek's "
                       "indexer keys by its own scores); choose one selection",
        "moba_block": "both select blocks (NSA by q . its compressed keys, MoBA by q . mean(K)); choose one",
        "ssmax": "SSMax scales each query by the log of the keys it sees, which differ between NSA's three branches",
        "differential": "differential attention subtracts two softmax maps of one kernel call, NSA adds three gated "
                        "branches; the two are not built together",
        "sinks": "a sink is one more key in one softmax, NSA has three",
        "forget_gate": "the forget gate biases each key by the tokens between it and the query, which a compressed "
                       "block of keys has no one count of"})  # fmt: skip
    # (its example with blocks of one key: then a window or a chunk of 3 and a top-n of 2 each cut what the other keeps)
    nsa_topk: int = option(NSA_TOPK, 2, reuse="function", stage="key selection", nsa_block=1, plan=("flops",))
    nsa_window: int = option(NSA_WINDOW, 2, reuse="function", stage="key selection", nsa_block=2, plan=("flops",))
    # DeepSeek-V4's compressed attention (model.attention.compressed): each query head attends, in one softmax, the
    # last compress_window keys and the compressed entries of blocks of this many positions, every one (HCA) or the
    # compress_topk its queries score highest (CSA); None: off
    compress_ratio: int | None = option(None, 2, reuse="weights", label=COMPRESSED, stage="key selection",
                                        bench="DeepSeek-V4's compressed attention (HCA; its window at 32): positions "
                                              "per entry, or none",
                                        exclusive="key selection", plan=("parameters", "flops", "activations"),
                                        conflicts={
        "sparse_topk": "both select the keys each query attends (compressed attention entries of blocks, DeepSeek's "
                       "indexer keys); choose one selection",
        "moba_block": "both select blocks (compressed attention attends pooled entries, MoBA the blocks' keys); "
                      "choose one",
        "nsa_block": "both attend compressed blocks (NSA in three gated softmaxes, DeepSeek-V4 in one); choose one",
        "ssmax": "SSMax scales each query by the log of the keys it sees, which the compressed entries do not count",
        "differential": "differential attention subtracts two softmax maps of one kernel call over the keys, "
                        "compressed attention's call is over keys and entries; the two are not built together",
        "forget_gate": "the forget gate biases each key by the tokens between it and the query, which a compressed "
                       "entry has no one count of"})  # fmt: skip
    # (the top-k's example with entries of one key: then a window or a chunk of 3 still shows a query two candidates,
    # of which a top-k of 1 keeps one)
    compress_topk: int | None = option(None, 1, reuse="function", stage="key selection", compress_ratio=1,
                                       plan=("flops",))
    compress_window: int = option(COMPRESS_WINDOW, 2, reuse="function", stage="key selection", compress_ratio=2,
                                  plan=("flops",))
    # Cross-layer KV sharing (CLA, YOCO, Gemma's shared-KV layers): the layer kind whose keys and values this layer
    # reads (a schedule's relation between layers, ``model.config.check_kv_sharing``), not an option of one block: a
    # block built with it projects queries only and keeps no cache (``MultiHeadAttention.reads_kv``). None: its own
    kv_from: str | None = None

    def __post_init__(self) -> None:
        check_heads(self.n_embd, self.n_head)
        kv = self.n_kv_head
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_head % kv):
            problem = "does not divide" if isinstance(kv, int) and kv >= 1 else "is not a positive divisor of"
            raise ValueError(f"model.n_kv_head={kv!r} {problem} model.n_head={self.n_head}; choose a divisor "
                             f"of n_head: {kv_head_choices(self.n_head)}")  # fmt: skip
        check_positions("window", self.window, "", "all")
        check_positions("attention_chunk", self.attention_chunk, " per chunk", "no chunks")
        check_positions("query_temperature", self.query_temperature, " (the queries' temperature grows each time the "
                        "position passes a multiple of it; Llama 4's 8192)", "off")  # fmt: skip
        check_ssmax(self.ssmax)
        if not isinstance(self.negative_eigenvalues, bool):
            raise ValueError(f"model.negative_eigenvalues={self.negative_eigenvalues!r} must be true (the delta rules' "
                             f"beta in (0, 2)) or false (in (0, 1))")  # fmt: skip
        if not isinstance(self.differential, bool):
            raise ValueError(f"model.differential={self.differential!r} must be true or false")
        if not finite_number(self.lambda_init) or not 0 < self.lambda_init < 1:
            raise ValueError(f"model.lambda_init={self.lambda_init!r} must be a number between 0 and 1, both excluded "
                             f"(the paper's 0.8, or 0.8 - 0.6 exp(-0.3 (l - 1)) at depth l)")  # fmt: skip
        if self.lambda_init != LAMBDA_INIT and not self.differential:
            raise ValueError(f"model.lambda_init={self.lambda_init} is differential attention's lambda: set "
                             f"model.differential=true, or leave model.lambda_init at {LAMBDA_INIT}")  # fmt: skip
        if self.differential and self.n_head % 2:
            raise ValueError(f"model.differential=true pairs heads 2h and 2h+1 into one, but model.n_head="
                             f"{self.n_head} is odd; use an even number of heads (model.n_head={self.n_head + 1} "
                             f"or {self.n_head - 1})")  # fmt: skip
        if self.differential and self.kv_heads % 2:
            even = [n for n in range(2, self.n_head + 1, 2) if self.n_head % n == 0]
            raise ValueError(f"model.differential=true pairs key/value heads too (each differential head's two maps "
                             f"read a key each of its group's pair, and a value two heads wide, the paper's grouped "
                             f"form), but model.n_kv_head={self.n_kv_head} is odd; use an even model.n_kv_head "
                             f"({', '.join(map(str, even))})")  # fmt: skip
        check_within_context("query_temperature", self.query_temperature, self.block_size,
                             "Llama 4's 8192 is its chunk", "off")  # fmt: skip
        check_within_context("attention_chunk", self.attention_chunk, self.block_size,
                             "a chunk of the whole context cuts only past it, as Llama 4's does", "no chunks")
        if self.window is not None and self.attention_chunk is not None and self.window >= self.attention_chunk:
            chunk = self.attention_chunk
            raise ValueError(f"model.window={self.window} cuts nothing inside model.attention_chunk={chunk}: a query "
                             f"sees at most the {chunk} keys of its chunk (itself included); use a window below "
                             f"{chunk}, or model.window=null (or model.attention_chunk=null)")  # fmt: skip
        kernel = registry.kernel(self.kernel)
        lookup(SDPA_BACKENDS, "model.sdpa_backend", self.sdpa_backend)
        if self.sdpa_backend != "auto" and self.sdpa_backend not in kernel.backends:
            takers = " or ".join(name for name, k in KERNELS.items() if self.sdpa_backend in k.backends)
            raise ValueError(f"model.sdpa_backend={self.sdpa_backend} chooses kernel={takers}'s implementation, but "
                             f"kernel={self.kernel}; use kernel={takers}, or model.sdpa_backend=auto")  # fmt: skip
        registry.position(self.position)
        if not finite_number(self.rope_theta) or not self.rope_theta > 1:  # NaN compares false: it is refused too
            raise ValueError(f"model.rope_theta={self.rope_theta!r} must be a finite number above 1 (10000: "
                             f"RoFormer's, Llama 2's; 500000: Llama 3's)")  # fmt: skip
        self.check_rope_scaling()
        self.check_rope_fraction()
        for selection in SELECTIONS.values():  # the key selections' own (model.attention.selection)
            selection.check(self)
        for mod in MODIFICATIONS.values():
            mod.check(getattr(self, mod.field))
        check_conflicts(self)

    def check_kernel_applies(self) -> None:
        """Refuse what this attention needs its kernel to apply (``kernel_effects``) and the kernel does not, naming
        the kernels that do: asked by a layer that runs a kernel (``options.check_applied``), never of one that runs
        its own form (Gated DeltaNet: the kernel is not the fix)."""
        kernel = registry.kernel(self.kernel)
        if "dropout" not in kernel.applies and self.dropout > 0:
            others = " or ".join(name for name, k in KERNELS.items() if "dropout" in k.applies)
            raise ValueError(f"kernel={self.kernel} has no attention dropout, but model.dropout={self.dropout}; set "
                             f"model.dropout=0, or use kernel={others}")  # fmt: skip
        for effect, option, what in self.kernel_effects:
            if effect not in kernel.applies:
                takers = " or ".join(kernel_name for kernel_name, k in KERNELS.items() if effect in k.applies)
                raise ValueError(f"{option} {what}, which kernel={self.kernel} cannot do; use "
                                 f"kernel={takers or 'none: no kernel applies it yet'}")  # fmt: skip

    def scaling_fix(self, scaling: str) -> str:
        """Every setting a rotary scaling still lacks, in one fix (each refusal naming only the next one led from
        error to error): ``model.position=rope model.rope_scaling=yarn model.rope_factor=<...>``."""
        fix = [] if registry.position(self.position).turns_queries_keys else ["model.position=rope"]
        fix.append(f"model.rope_scaling={scaling}")
        if self.rope_factor == 1:
            fix.append("model.rope_factor=<the read length over the trained one, above 1>")
        return " ".join(fix)

    def check_rope_scaling(self) -> None:
        scaling, factor = self.rope_scaling, self.rope_factor
        if self.rope_original_length is not None and scaling != "yarn":
            raise ValueError(f"model.rope_original_length={self.rope_original_length!r} is the trained length YaRN "
                             f"counts each pair's turns over, but model.rope_scaling={spelled(scaling)}; set "
                             f"{self.scaling_fix('yarn')}, or model.rope_original_length=null")  # fmt: skip
        if scaling is None:
            if factor != 1.0:
                raise ValueError(f"model.rope_factor={factor!r} scales nothing without model.rope_scaling; "
                                 f"set model.rope_scaling={'|'.join(ROPE_SCALINGS)}, or leave rope_factor at "
                                 f"1")  # fmt: skip
            return
        if scaling not in ROPE_SCALINGS:
            raise ValueError(f"model.rope_scaling={scaling!r}; choose one of: {', '.join(ROPE_SCALINGS)} (position "
                             f"interpolation, NTK-aware, YaRN), or null")  # fmt: skip
        if not registry.position(self.position).turns_queries_keys:
            raise ValueError(f"model.rope_scaling={scaling} scales rotary positions, but model.position="
                             f"{self.position} turns nothing; use {self.scaling_fix(scaling)}, or "
                             f"model.rope_scaling=null")  # fmt: skip
        if isinstance(factor, bool) or not finite_number(factor) or not factor >= 1:
            raise ValueError(f"model.rope_factor={factor!r} must be a finite number of at least 1 (4: read 4x "
                             f"the trained length)")  # fmt: skip
        if factor == 1:  # every scaling by 1 is rotary as it is
            raise ValueError(f"model.rope_scaling={scaling} at model.rope_factor=1 scales nothing (the same function "
                             f"as no scaling); set model.rope_factor=<the read length over the trained one, above 1>, "
                             f"or model.rope_scaling=null")  # fmt: skip
        original = self.block_size if self.rope_original_length is None else self.rope_original_length
        if scaling == "yarn" and (not isinstance(original, int) or isinstance(original, bool) or original < 1):
            raise ValueError(f"model.rope_scaling=yarn counts each pair's turns over the trained length: "
                             f"model.rope_original_length={self.rope_original_length!r} must be a positive number "
                             f"of tokens (null: block_size)")  # fmt: skip

    def check_rope_fraction(self) -> None:
        fraction = self.rope_fraction
        if isinstance(fraction, bool) or not finite_number(fraction) or not 0 < fraction <= 1:
            raise ValueError(f"model.rope_fraction={fraction!r} must be in (0, 1]: the share of each head's dims "
                             f"that rotary turns (1: all; Qwen3-Next: 0.25)")  # fmt: skip
        if fraction == 1:
            return
        if not registry.position(self.position).turns_queries_keys:
            raise ValueError(f"model.rope_fraction={fraction:g} is the share of each head's dims that rotary turns, "
                             f"but model.position={self.position} turns nothing; use model.position=rope, or "
                             f"model.rope_fraction=1")  # fmt: skip
        turned = fraction * self.head_dim
        if turned != int(turned) or int(turned) % 2:
            even = [f"{k / self.head_dim:g}" for k in range(2, self.head_dim, 2)][:4]
            raise ValueError(f"model.rope_fraction={fraction:g} turns {fraction:g} x {self.head_dim} = {turned:g} "
                             f"of each head's {self.head_dim} dims; rotary turns pairs: choose a fraction that "
                             f"turns an even whole number of them ({', '.join(even)}, ...)")  # fmt: skip

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rotary turns (``rope_fraction`` of them)."""
        return round(self.rope_fraction * self.head_dim)

    def rotary(self, dim: int):
        """The rotation of ``dim`` dims of queries and keys at this spec's positions (base, scaling read past the
        trained length), or None where its position encoding turns nothing: a head's, a sparse indexer's."""
        scaling = {} if self.rope_scaling is None else dict(
            scaling=self.rope_scaling, factor=float(self.rope_factor),
            original=self.block_size if self.rope_original_length is None else self.rope_original_length)  # fmt: skip
        return registry.position(self.position).rotary(dim, self.rope_theta, **scaling)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def score_mods(self) -> tuple[str, ...]:
        """The modifications of the scores this attention uses (``model.attention.modifications``), by name."""
        return tuple(name for name, mod in MODIFICATIONS.items()
                     if mod.on_scores and mod.used(getattr(self, mod.field)))  # fmt: skip

    @property
    def kernel_effects(self) -> list[tuple[str, str, str]]:
        """What this attention needs its kernel to apply, each (effect, the option that asks for it, what it does):
        its masks and its modifications of the scores (``AttentionKernel.applies`` names the ones a kernel does)."""
        effects = [(mask.name, f"model.{mask.field}={value}", "masks keys its queries do not see")
                   for mask, value in masks_set(self)]  # fmt: skip
        if self.document_masking:
            effects.append(("documents", "model.document_masking=true", "masks keys of other documents"))
        effects += [("sparse", selection.option(self), selection.does) for selection in SELECTIONS.values()
                    if selection.used(self)]  # fmt: skip
        return effects + [(name, MODIFICATIONS[name].option(getattr(self, MODIFICATIONS[name].field)),
                           "changes the scores before the softmax") for name in self.score_mods]  # fmt: skip

    @property
    def context(self) -> int | None:
        """Keys a query sees at most: the window; or, for a model that reads past its ``block_size`` (no
        position table), the block size as well (its training context); None: every earlier key."""
        if not registry.position(self.position).runs_past_context or self.block_size is None:
            return self.window
        return min(self.window or self.block_size, self.block_size)

    @property
    def masks(self) -> Masks:
        """The masks this attention's queries see keys through (``model.attention.masks``): causal, and its context's
        window."""
        return masks_of(self)

    def build_kernel(self):
        return get_kernel(self.kernel, self.masks, self.sdpa_backend)


def check_positions(name: str, value, unit: str, null: str) -> None:
    """Refuse an option that counts positions unless it is a positive integer or None: ``model.<name>=<value> must be
    a positive number of positions<unit>, or null (<null>)``."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"model.{name}={value!r} must be a positive number of positions{unit}, or null ({null})")


def check_ssmax(value) -> None:
    """Refuse an initial s of SSMax that is not a positive finite number (0 would zero every query: uniform weights)."""
    if value is not None and (isinstance(value, bool) or not finite_number(value) or not value > 0):
        raise ValueError(f"model.ssmax={value!r} must be a positive number, SSMax's initial s per head (each query "
                         f"scaled by s log n, n the keys it sees; the paper's 0.43), or null (off)")


def check_one_pair(spec: AttentionSpec, width: int, what: str, wider: str) -> None:
    """Refuse what a rotation of one pair of dims (``width`` 2: ``what`` sets it) leaves unchanged: its one frequency
    is theta^0 = 1 whatever the base, so model.rope_theta and NTK's scaling (which raises the base) do nothing."""
    if width != 2 or not registry.position(spec.position).turns_queries_keys:
        return
    base = next(f.default for f in fields(AttentionSpec) if f.name == "rope_theta")
    if spec.rope_theta != base:
        raise ValueError(f"model.rope_theta={spec.rope_theta:g} changes nothing: rotary turns one pair of dims here "
                         f"({what}), whose one frequency is theta^0 = 1 at any base; use {wider}, or leave "
                         f"model.rope_theta at {base:g}")  # fmt: skip
    if spec.rope_scaling == "ntk":
        raise ValueError(f"model.rope_scaling=ntk raises rotary's base, which changes nothing when rotary turns one "
                         f"pair of dims ({what}): its one frequency is theta^0 = 1; use {wider}, or "
                         f"model.rope_scaling=pi or yarn")  # fmt: skip


def check_within_context(name: str, value: int | None, block_size: int | None, why: str, null: str) -> None:
    """Refuse an option that counts positions past the model's context, where it would act only beyond it."""
    if value is not None and block_size is not None and value > block_size:
        raise ValueError(f"model.{name}={value} is longer than the context (model.block_size={block_size}): set it "
                         f"to at most {block_size} ({why}), or null ({null})")


def check_heads(n_embd: int, n_head: int) -> None:
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; choose n_embd as a multiple of n_head, "
                         f"or an n_head that divides it: {', '.join(map(str, divisors(n_embd)))}")  # fmt: skip


def kv_head_choices(n_head: int) -> str:
    """The valid model.n_kv_head values for ``n_head`` heads, with what the two ends mean."""
    middle = [str(d) for d in divisors(n_head)[1:-1]]
    if n_head == 1:
        return "1 or null (one head)"
    return ", ".join(["1 (multi-query)", *middle]) + f", {n_head} or null (multi-head)"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]

"""A fourth layout and a fourth kernel are one class each, registered beside the others: the plan (bf16),
training, conversion and the plots ask the class, never its name (issue 29, item 1). And no layout or kernel
name is matched outside its own module, the registry and the configs (a source scan)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch
from helpers import GPT2_LAYOUTS, ROOT, TINY, compose_train, read_metrics, tiny_gpt_config
from omegaconf import OmegaConf
from test_gpu_readiness import saved_tensor_bytes

from analysis.plots import throughput_figure, val_loss_figure
from analysis.report import build_rows
from analysis.runs import find_runs
from cli import check_attention_and_kernel
from measuring import bench_command, step_figures
from model import GPT, GPTConfig, build_attention, convert_attention_layout, detect_attention_layout
from model.attention.kernels import ManualKernel
from model.attention.layouts import SeparateQKVAttention
from model.checkpoints.convert import initial_form
from model.registry import KERNELS, MIXERS, canonical_layout, kernel_options
from training.loop import train
from training.plan import activation_bytes, make_plan


class RenamedQKVAttention(SeparateQKVAttention):
    """separate_qkv under other parameter names (q_proj, k_proj, v_proj): a fourth layout, as one class."""

    name, colour, marker = "renamed_qkv", "tab:red", "D"
    QKV_KEY = re.compile(r"(?P<proj>q_proj|k_proj|v_proj)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "q_proj"
    LINEARS = ("q_proj", "k_proj", "v_proj")


class DrawingQKVAttention(RenamedQKVAttention):
    """renamed_qkv that draws numbers of its own while it is built (a random buffer, and its projections'
    default init twice): a layout built otherwise than the canonical one."""

    name = "drawing_qkv"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self.register_buffer("noise", torch.rand(7), persistent=False)
        for linear in (self.q_proj, self.k_proj, self.v_proj):
            linear.reset_parameters()


class TextbookKernel(ManualKernel):
    """The manual kernel under another name and line style: a fourth kernel, as one class."""

    name = "textbook"
    line_style, line_name, hatch = "-.", "dash-dot", "xx"


@pytest.fixture
def fourth(monkeypatch):
    """The fourth layout and kernel, registered for one test (as their modules' decorators would)."""
    monkeypatch.setitem(MIXERS, RenamedQKVAttention.name, RenamedQKVAttention)
    monkeypatch.setitem(KERNELS, TextbookKernel.name, TextbookKernel)


def gpt2_small_plan(dtype: torch.dtype, **model):
    cfg = OmegaConf.to_object(compose_train("model=gpt2_small", "trainer.micro_batch_size=8"))
    config = GPTConfig(**{**vars(cfg.model), "vocab_size": 50257, **model})
    return make_plan(cfg, config, 1, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_plan_of_a_fourth_layout_and_kernel_in_half_precision_is_that_of_what_they_rename(fourth, dtype):
    renamed = gpt2_small_plan(dtype, attention="renamed_qkv", kernel="textbook")
    original = gpt2_small_plan(dtype, attention="separate_qkv", kernel="manual")
    assert renamed.activations == original.activations
    assert "attention matrices" in renamed.activations, "the textbook kernel keeps the score matrices, as manual"
    assert "plan: gpt2_small (renamed_qkv + textbook)" in renamed.text()


def test_a_fourth_layouts_bf16_estimate_is_within_25_percent_of_what_autograd_saves(fourth):
    config = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=4, n_embd=64, attention="renamed_qkv",
                       kernel="textbook")  # fmt: skip
    model = GPT(config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = saved_tensor_bytes(model, torch.randint(0, 257, (4, 64)))
    estimated = sum(activation_bytes(config, 4, torch.bfloat16).values())
    assert abs(estimated - measured) / measured < 0.25, (estimated, measured)


@pytest.mark.parametrize("other", GPT2_LAYOUTS)
def test_a_fourth_layout_converts_exactly_to_and_from_every_other(fourth, other):
    torch.manual_seed(0)
    config = tiny_gpt_config(n_head=4, n_kv_head=2)
    renamed = GPT(tiny_gpt_config(n_head=4, n_kv_head=2, attention="renamed_qkv")).eval()
    state = renamed.state_dict()
    assert detect_attention_layout(state) == "renamed_qkv"
    assert any(key.endswith("attn.q_proj.weight") for key in state)
    there = convert_attention_layout(state, "renamed_qkv", other, n_head=4)
    back = convert_attention_layout(there, other, "renamed_qkv")
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    model = GPT(GPTConfig(**{**vars(config), "attention": other})).eval()
    model.load_weights(there)
    idx = torch.randint(0, 50, (2, 8))
    torch.testing.assert_close(model(idx, idx)[0], renamed(idx, idx)[0], rtol=0, atol=1e-5)


def test_a_fourth_layout_starts_from_the_weights_of_every_other(fourth):
    torch.manual_seed(3)
    renamed = GPT(tiny_gpt_config(attention="renamed_qkv")).state_dict()
    torch.manual_seed(3)
    fused = GPT(tiny_gpt_config(attention="fused_qkv")).state_dict()
    converted = convert_attention_layout(renamed, "renamed_qkv", "fused_qkv")
    assert all(torch.equal(converted[k], fused[k]) for k in fused)


@pytest.mark.parametrize("layout", [*(name for name in MIXERS if initial_form(name) == canonical_layout()),
                                    DrawingQKVAttention.name])  # fmt: skip
def test_same_seed_same_function_same_initial_weights_however_a_layout_is_built(monkeypatch, layout):
    monkeypatch.setitem(MIXERS, DrawingQKVAttention.name, DrawingQKVAttention)
    canonical = canonical_layout()
    built = {}
    for name in (canonical, layout):
        torch.manual_seed(11)
        model = GPT(tiny_gpt_config(n_head=4, n_kv_head=2, attention=name))
        built[name] = convert_attention_layout(model.state_dict(), name, canonical, n_head=4), torch.rand(3)
    (theirs, after_theirs), (ours, after_ours) = built[canonical], built[layout]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert torch.equal(after_ours, after_theirs), "building the model leaves the generator where the canonical does"


def test_a_fourth_kernel_attends_as_the_one_it_renames_and_is_a_valid_option_everywhere(fourth):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    manual = build_attention("fused_qkv", 16, 4, "manual", n_kv_head=2, window=3)
    textbook = build_attention("fused_qkv", 16, 4, "textbook", n_kv_head=2, window=3)
    textbook.load_state_dict(manual.state_dict())
    torch.testing.assert_close(textbook(x), manual(x), rtol=0, atol=1e-6)
    assert "textbook" in kernel_options()
    assert bench_command.parse_args(["--kernels", "textbook"]).kernels == ["textbook"]
    check_attention_and_kernel("renamed_qkv", "textbook")  # sample/evaluate/heads take them: no error
    with pytest.raises(ValueError, match=r"model.sdpa_backend=flash chooses kernel=sdpa's implementation, but "
                                         r"kernel=textbook"):  # fmt: skip
        GPTConfig(kernel="textbook", sdpa_backend="flash")


def test_a_fourth_layout_and_kernel_train_to_the_same_losses_and_get_their_own_plot_styles(fourth, tmp_path,
                                                                                          data_cache):  # fmt: skip
    runs = {}
    for attention, kernel in (("separate_qkv", "manual"), ("renamed_qkv", "manual"), ("separate_qkv", "textbook")):
        run_dir = tmp_path / f"{attention}-{kernel}"
        train(compose_train(*TINY, "logger=none", "trainer.max_steps=4", "trainer.eval_interval=2",
                            f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                            f"model.attention={attention}", f"model.kernel={kernel}"))  # fmt: skip
        runs[attention, kernel] = [m["train/loss"] for m in read_metrics(run_dir) if "train/loss" in m]
    reference = runs["separate_qkv", "manual"]
    assert len(reference) == 4
    for losses in runs.values():
        assert losses == pytest.approx(reference, abs=1e-6), "the same function from the same initial weights"

    found = find_runs([tmp_path])
    lines = {line.get_label(): line for line in val_loss_figure(found, "step").axes[0].get_lines()}
    renamed, textbook = lines["renamed_qkv-manual"], lines["separate_qkv-textbook"]
    assert (renamed.get_marker(), renamed.get_linestyle()) == ("D", "--")
    assert (textbook.get_marker(), textbook.get_linestyle()) == ("s", "-.")
    bars = throughput_figure(found, build_rows(found, None)[0])
    assert "hatched: manual and textbook kernels" in bars.axes[0].get_title()
    assert sorted(bar.get_hatch() for bar in bars.axes[0].patches) == ["//", "//", "xx"]


def test_bench_draws_and_names_a_fourth_kernels_line_style(fourth):
    rows = [dict(mode="block", layout="renamed_qkv", kernel=kernel, kv_heads=4, window=None, compile="eager",
                 seq_len=n, n_head=4, forward_ms=1.0, step_ms=2.0 * n) for kernel in ("sdpa", "textbook")
            for n in (8, 16)]  # fmt: skip
    ax = step_figures.figure(rows, "tiny", "forward+backward").axes[0]
    assert {line.get_linestyle() for line in ax.get_lines()} == {"-", "-."}
    assert {line.get_color() for line in ax.get_lines()} == {"tab:red"}
    assert "dash-dot: textbook kernel" in ax.get_legend().get_title().get_text()


# Layout and kernel names as string literals: only their own modules, the registry and the configs say them.
NAMES = (*MIXERS, *KERNELS)  # as registered at import: the fixtures' fourth ones come later
SCANNED = ["model", "training", "analysis", "cli", "measuring", "sample.py", "heads.py", "evaluate.py", "export.py",
           "compare.py"]  # fmt: skip
OWN_MODULES = {Path(inspect.getfile(cls)).relative_to(ROOT).as_posix()  # layouts.py, latent.py, kernels.py
               for cls in (*MIXERS.values(), *KERNELS.values())} | {"model/registry.py"}
# Places that only NAME a default (or a fixed format), each with why; a literal that goes away must leave here.
ALLOWED = {
    ("model/config.py", "fused_qkv"): "GPTConfig's default attention",
    ("model/config.py", "sdpa"): "GPTConfig's default kernel",
    ("model/attention/spec.py", "sdpa"): "AttentionSpec's default kernel",
    ("model/checkpoints/gpt2_import.py", "fused_qkv"): "import_hf_gpt2's default layout (GPT-2's own)",
    ("model/checkpoints/gpt2_import.py", "sdpa"): "import_hf_gpt2's default kernel",
    ("model/checkpoints/pretrained.py", "fused_qkv"): "load_pretrained_gpt2's default layout",
    ("model/checkpoints/pretrained.py", "sdpa"): "load_pretrained_gpt2's default kernel",
    ("model/checkpoints/gpt2_export.py", "fused_qkv"): "the export writes GPT-2's format, whose attention is "
                                                        "c_attn: fused",
    ("model/checkpoints/gpt2_export.py", "sdpa"): "the kernel of the model the export builds (any would do)",
    ("measuring/bench_command.py", "manual"): "bench.py's default --kernels",
    ("measuring/bench_command.py", "sdpa"): "bench.py's default --kernels",
    ("measuring/reference_command.py", "fused_qkv"): "bench_reference.py's default --attention",
    ("measuring/reference_command.py", "sdpa"): "bench_reference.py's default --kernel",
    ("measuring/story_stages.py", "fused_qkv"): "the MFU goal is the GPU preset's fused_qkv/sdpa step's (issue 53)",
    ("measuring/story_stages.py", "sdpa"): "the MFU goal is the GPU preset's fused_qkv/sdpa step's (issue 53)",
    **{("measuring/plain_attention.py", name): "the plainest code of each GPT-2 layout and kernel it writes out"
       for name in ("wrapper", "separate_qkv", "fused_qkv", "manual", "sdpa")},
}


def name_literals(path: Path) -> set[str]:
    """The string constants of ``path`` (docstrings aside) that spell a layout or kernel (``sdpa_flash`` and the
    prefix ``sdpa_`` included)."""
    spelled = set(NAMES) | set(kernel_options()) | {f"{name}_" for name in NAMES}
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docstrings
            and isinstance(node.value, str) and node.value in spelled}  # fmt: skip


def test_no_layout_or_kernel_name_is_matched_outside_its_own_module_the_registry_and_the_configs():
    paths = [p for entry in SCANNED for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                              else [ROOT / entry])]  # fmt: skip
    found = {(str(p.relative_to(ROOT)), name) for p in paths if str(p.relative_to(ROOT)) not in OWN_MODULES
             for name in name_literals(p)}  # fmt: skip
    assert found - ALLOWED.keys() == set(), "ask model.registry (a layout's or kernel's own facts) instead"
    assert ALLOWED.keys() - found == set(), "an allowed literal went away: take it off ALLOWED"
    assert name_literals(ROOT / "model/attention/kernels.py") >= {"manual", "sdpa", "flex"}, "the scan sees literals"


def test_a_layout_whose_weight_names_another_layout_claims_is_refused_as_it_registers():
    """The unwritten rule made a declared fact (issue 52, item 7): a retention layer whose projection reuses Gated
    DeltaNet's ``in_proj`` would load as Gated DeltaNet, and said only "cannot convert" later. Refused at once."""
    from model.registry import register

    class InProjAttention(RenamedQKVAttention):
        name, QKV_KEY, QKV_EXAMPLE = "in_proj_layer", re.compile(r"(?P<proj>in_proj)\.(?P<kind>weight)$"), "in_proj"

    registry = dict(MIXERS)
    with pytest.raises(ValueError, match=r"attention=in_proj_layer's weight names \(in_proj\.weight\) are "
                                         r"attention=gated_deltanet's .* name its projections otherwise"):  # fmt: skip
        register(registry)(InProjAttention)
    assert "in_proj_layer" not in registry
    register(registry)(RenamedQKVAttention)  # names of its own: registered
    assert registry["renamed_qkv"] is RenamedQKVAttention


def test_a_layer_of_its_own_form_states_its_options_and_plan_terms_or_is_refused_as_it_registers():
    """A layer that runs no kernel (linear attention) applies only the options it says and prices itself only as it
    says: a layer built on Gated DeltaNet (as KDA is) took its applies, memory and FLOP estimates silently (issue
    61). Refused as it registers, naming the term and where it came from; with its own, registered. A layout of the
    same function may share them (a renamed separate_qkv)."""
    from model.attention.pipeline import OWN_FORM_TERMS
    from model.mixers.deltanet import GatedDeltaNet
    from model.registry import register

    class Retention(GatedDeltaNet):
        name, function = "retention", "retention"
        QKV_KEY, QKV_EXAMPLE = re.compile(r"(?P<proj>ret_proj)\.(?P<kind>weight|bias)$"), "ret_proj"

    registry = dict(MIXERS)
    with pytest.raises(ValueError, match=r"^attention=retention takes input_casts from attention=gated_deltanet: a "
                                         r"plan term is the layer's own .*; define input_casts in its class$"):
        register(registry)(Retention)
    assert "retention" not in registry

    class Measured(Retention):
        name = "measured_retention"
        applies = frozenset({"position", "dropout"})
        locals().update({term: classmethod(lambda cls, *args: 0) for term in OWN_FORM_TERMS})

    register(registry)(Measured)
    assert registry["measured_retention"] is Measured

    class Unsaid(Measured):  # every term of its own, but its options inherited
        name, function = "unsaid", "unsaid"
        locals().update({term: classmethod(lambda cls, *args: 0) for term in OWN_FORM_TERMS})

    with pytest.raises(ValueError, match=r"^attention=unsaid takes applies from attention=measured_retention: its "
                                         r"options are the layer's own"):  # fmt: skip
        register(registry)(Unsaid)
    register(registry)(RenamedQKVAttention)  # separate_qkv's widths, one function: shared


def test_no_layout_shadows_an_attribute_the_base_attention_sets():
    """What the base attention class sets on a block (its masks, modifications, spec, encodings, ...) is every
    layout's: a class attribute of the same name in a layout (``chunk`` in Gated DeltaNet, were the base to set a
    ``chunk``) would be hidden by it, and the layout would compute with the base's value."""
    from model.attention import AttentionSpec, MultiHeadAttention

    class Probe(MultiHeadAttention):
        name = "probe"
        score_widths = classmethod(lambda cls, spec: (spec.n_embd, spec.n_embd))

    probe = Probe(AttentionSpec(16, 2))
    set_by_base = set(vars(probe)) | set(probe._modules) | set(probe._parameters) | set(probe._buffers)
    for name, cls in MIXERS.items():
        own = {attr for klass in cls.__mro__[: cls.__mro__.index(MultiHeadAttention)] for attr in vars(klass)}
        assert not own & set_by_base, f"attention={name} defines {sorted(own & set_by_base)}, which the base sets"

"""headlab's model: one GPT, its attention pipeline and layouts (``model.attention``), its mixers of their own form
(``model.mixers``), decoding (``model.decoding``) and checkpoints, conversion and loading (``model.checkpoints``)."""

from model import registry

registry.discover()  # every module of model.attention and model.mixers registers what it defines

from model.attention.kernels import KERNELS  # noqa: E402
from model.attention.layouts import CausalAttentionHead  # noqa: E402
from model.attention.pipeline import MultiHeadAttention, build_attention  # noqa: E402
from model.checkpoints.checkpoint import Checkpoint, load_checkpoint  # noqa: E402
from model.checkpoints.convert import (  # noqa: E402
    convert_attention_layout,
    detect_attention_layout,
    same_function_layouts,
)
from model.checkpoints.gpt2_import import import_hf_gpt2  # noqa: E402
from model.checkpoints.load import LoadedModel, load_model  # noqa: E402
from model.config import GPTConfig  # noqa: E402
from model.decoding.generation import generate, sample_next  # noqa: E402
from model.decoding.kv_cache import KVCache  # noqa: E402
from model.gpt import GPT  # noqa: E402
from model.registry import MIXERS  # noqa: E402

__all__ = [
    "MIXERS",
    "KERNELS",
    "GPT",
    "KVCache",
    "CausalAttentionHead",
    "Checkpoint",
    "GPTConfig",
    "LoadedModel",
    "MultiHeadAttention",
    "build_attention",
    "convert_attention_layout",
    "detect_attention_layout",
    "generate",
    "import_hf_gpt2",
    "load_checkpoint",
    "load_model",
    "sample_next",
    "same_function_layouts",
]

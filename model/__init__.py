"""headlab's model: one GPT, three attention layouts, two kernels."""

from model.attention import ATTENTION_LAYOUTS, CausalAttention, build_attention
from model.config import GPTConfig
from model.convert import convert_attention_layout, detect_attention_layout
from model.generation import generate, sample_next
from model.gpt import GPT, KVCache
from model.gpt2_import import import_hf_gpt2
from model.kernels import KERNELS

__all__ = [
    "ATTENTION_LAYOUTS",
    "KERNELS",
    "GPT",
    "KVCache",
    "CausalAttention",
    "GPTConfig",
    "build_attention",
    "convert_attention_layout",
    "detect_attention_layout",
    "generate",
    "import_hf_gpt2",
    "sample_next",
]

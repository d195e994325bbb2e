"""headlab's model: one GPT, three attention layouts, two kernels."""

from model.attention import ATTENTION_LAYOUTS, CausalAttention, build_attention
from model.config import GPTConfig
from model.convert import convert_attention_layout, detect_attention_layout
from model.gpt import GPT
from model.gpt2_import import import_hf_gpt2
from model.kernels import KERNELS

__all__ = [
    "ATTENTION_LAYOUTS",
    "KERNELS",
    "GPT",
    "CausalAttention",
    "GPTConfig",
    "build_attention",
    "convert_attention_layout",
    "detect_attention_layout",
    "import_hf_gpt2",
]

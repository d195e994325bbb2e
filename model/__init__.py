"""headlab's model: one GPT, three attention layouts of one function, multi-head latent attention and Gated
DeltaNet, its kernels, one loader."""

from model import deltanet as _deltanet  # noqa: F401  (registers attention=gated_deltanet)
from model import kda as _kda  # noqa: F401  (registers attention=kda)
from model import latent as _latent  # noqa: F401  (registers attention=mla)
from model.attention import ATTENTION_LAYOUTS, CausalAttentionHead, MultiHeadAttention, build_attention
from model.checkpoint import Checkpoint, load_checkpoint
from model.config import GPTConfig
from model.convert import convert_attention_layout, detect_attention_layout, same_function_layouts
from model.generation import generate, sample_next
from model.gpt import GPT
from model.gpt2_import import import_hf_gpt2
from model.kernels import KERNELS
from model.kv_cache import KVCache
from model.load import LoadedModel, load_model

__all__ = [
    "ATTENTION_LAYOUTS",
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

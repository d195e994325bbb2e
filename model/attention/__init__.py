"""Softmax attention: the one pipeline (``pipeline``) and its parts, each a module of one job: the spec and its
options (``spec``, ``options``), the layouts' projections (``layouts``, ``latent``), the heads' encodings
(``positions``), the key selections (``masks``, ``sparse``), the kernels and the modifications they apply
(``kernels``, ``modifications``), the heads' combination (``differential``). Importing the package registers every
layout its modules define (``model.registry.discover``)."""

from model.attention.pipeline import MultiHeadAttention, attention_of, build_attention
from model.attention.spec import AttentionSpec, option

__all__ = ["AttentionSpec", "MultiHeadAttention", "attention_of", "build_attention", "option"]

"""Inference: the KV cache (``kv_cache``), the decode steps (``steps``: eager, CUDA graph, compiled), generation
(``generation``) and its packed path (``packed``), and what a model reads past its trained length (``context``).
They use the model, never the reverse."""

"""Checkpoints and weights: the checkpoint record (``checkpoint``), the one loader every script uses (``load``),
exact conversion between layouts (``convert``), GPT-2's format both ways (``gpt2_export``, ``gpt2_import``) and Hugging
Face folders (``pretrained``)."""

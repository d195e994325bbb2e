"""Pretrained GPT-2 from the Hugging Face hub (or a local ``save_pretrained`` folder).

Downloads ``config.json`` and ``model.safetensors`` through ``huggingface_hub``
(cached in the HF cache) and imports them into a headlab GPT of any layout.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.run_files import LAST
from model.gpt import GPT
from model.gpt2_import import import_hf_gpt2

HUB_GPT2 = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
_FILES = ["config.json", "model.safetensors"]


def is_pretrained_source(source: str) -> bool:
    """A hub GPT-2 name, an ``org/name`` repo id, or a folder written by ``save_pretrained``."""
    path = Path(source).expanduser()
    if path.is_dir():
        return (path / "config.json").exists() and not (path / LAST).exists()
    return source in HUB_GPT2 or source.startswith("openai-community/")


def load_pretrained_gpt2(source: str, attention: str = "fused_qkv", kernel: str = "sdpa") -> GPT:
    from safetensors.torch import load_file

    folder = Path(source).expanduser()
    if not folder.is_dir():
        folder = _download(source)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "gpt2":
        raise ValueError(f"{source} holds a {config.get('model_type')!r} model, not GPT-2")
    weights = load_file(folder / "model.safetensors")
    # Hub repos store the base model ("h.0...", "wte.weight"); save_pretrained adds "transformer.".
    weights = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
               for k, v in weights.items()}  # fmt: skip
    return import_hf_gpt2(weights, n_head=config["n_head"], attention=attention, kernel=kernel)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_FILES))
    except Exception as err:  # offline, unknown repo, HF_HUB_OFFLINE without a cached copy
        raise RuntimeError(
            f"could not get {repo_id!r} from the Hugging Face hub ({type(err).__name__}: {str(err)[:200]}); "
            f"it needs the network the first time (then it is cached), or pass a local folder "
            f"written by transformers' save_pretrained"
        ) from err

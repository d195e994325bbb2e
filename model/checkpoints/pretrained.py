"""Pretrained GPT-2 from the Hugging Face hub (or a local ``save_pretrained`` folder).

Downloads ``config.json`` and ``model.safetensors`` through ``huggingface_hub``
(cached in the HF cache) and imports them into a headlab GPT of any layout.
Only safetensors weights are read (``model.safetensors``, or the shards its index names):
a ``pytorch_model.bin`` is a pickle, which can run code as it loads, so a folder holding
only that is refused with the one command that converts it.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.run_files import LAST
from model.checkpoints.gpt2_import import import_hf_gpt2
from model.gpt import GPT

HUB_GPT2 = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # transformers' older format: never unpickled here
_FILES = [CONFIG, WEIGHTS]


def is_pretrained_source(source: str) -> bool:
    """A hub GPT-2 name, an ``org/name`` repo id, or a folder of a Hugging Face model (``save_pretrained``'s
    files, or some of them: what is missing is named when it loads)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return not (path / LAST).exists() and any((path / name).exists() for name in (CONFIG, WEIGHTS, INDEX, *PICKLED))
    return source in HUB_GPT2 or source.startswith("openai-community/")


def held(folder: Path, most: int = 6) -> str:
    """What a folder holds, in words: its first ``most`` file names."""
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "") or "nothing"


def convert_command(folder: Path) -> str:
    """The transformers one-liner that rewrites a folder's pickled weights as model.safetensors."""
    return (f"python -c \"from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('{folder}')"
            f".save_pretrained('{folder}', safe_serialization=True)\"")  # fmt: skip


def read_config(folder: Path) -> dict:
    """A Hugging Face folder's config.json, refused in one line where it is missing, unreadable or not GPT-2's."""
    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds {held(folder)} but no {CONFIG}: a Hugging Face folder needs {CONFIG} "
                                f"beside {WEIGHTS} (transformers' save_pretrained writes both)")  # fmt: skip
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON ({type(err).__name__}: {err}); write the folder again with "
                         f"transformers' save_pretrained") from None  # fmt: skip
    if not isinstance(config, dict) or config.get("model_type") != "gpt2":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise ValueError(f"{folder} holds a {kind!r} model, not GPT-2 (its {CONFIG} says model_type={kind!r}); "
                         f"headlab imports GPT-2 only")  # fmt: skip
    if not isinstance(config.get("n_head"), int):
        raise ValueError(f"{path} has no n_head (the number of attention heads, which the weights do not show); "
                         f"write the folder again with transformers' save_pretrained")  # fmt: skip
    return config


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder's weights: model.safetensors, or the shards its index names. A folder
    without them is refused in one line: what it holds, what is read, and how to convert pickled weights."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / INDEX).is_file():
        try:
            shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{folder / INDEX} is not a safetensors index (no readable weight_map: "
                             f"{type(err).__name__}); write the folder again with save_pretrained") from None
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks {missing[0]}, one of the {len(shards)} shards {INDEX} names; "
                                    f"copy every shard into the folder")  # fmt: skip
        return [folder / name for name in shards]
    pickled = [name for name in PICKLED if (folder / name).exists()]
    if pickled:
        raise FileNotFoundError(f"{folder} holds {pickled[0]} but no {WEIGHTS}: headlab reads only safetensors "
                                f"weights (a .bin is a pickle, which can run code as it loads); convert it once "
                                f"with transformers: {convert_command(folder)}")  # fmt: skip
    raise FileNotFoundError(f"{folder} holds {held(folder)} but no weights ({WEIGHTS}): write the folder with "
                            f"transformers' save_pretrained (it writes {CONFIG} and {WEIGHTS}), or with export.py "
                            f"from a run")  # fmt: skip


def read_weights(folder: Path) -> dict:
    """Every tensor of a folder's safetensors files, refused in one line naming a file that is not safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = {}
    for path in weight_files(folder):
        try:
            weights.update(load_file(path))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is not a readable safetensors file ({type(err).__name__}: {err}); copy it "
                             f"again or write the folder again with save_pretrained") from None  # fmt: skip
    return weights


def load_pretrained_gpt2(source: str, attention: str = "fused_qkv", kernel: str = "sdpa") -> GPT:
    folder = Path(source).expanduser()
    if not folder.is_dir():
        folder = _download(source)
    config = read_config(folder)
    weights = read_weights(folder)
    # Hub repos store the base model ("h.0...", "wte.weight"); save_pretrained adds "transformer.".
    weights = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
               for k, v in weights.items()}  # fmt: skip
    try:
        return import_hf_gpt2(weights, n_head=config["n_head"], attention=attention, kernel=kernel)
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None


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

"""DataConfig: where text comes from, how it is tokenized and split (the `data` config group)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("pystdlib", "files", "url", "hub", "retrieval")
SAMPLE_BY = ("document", "paragraph", "line")


@dataclass
class DataConfig:
    name: str = "pystdlib"  # a label: names the cache directory and the wandb config
    source: str = "pystdlib"  # pystdlib | files | url | hub | retrieval (data/retrieval.py's tasks, generated)
    path: str | None = None  # files: a file, directory or glob; hub: the dataset's repo id (or a local folder)
    subset: str | None = None  # hub: the dataset's config name (e.g. sample-10BT)
    split: str = "train"  # hub: which split to read
    url: str | None = None  # url: a text file, downloaded once into the cache
    text_column: str = "text"  # parquet/jsonl/hub: the column holding the documents
    sample_by: str = "document"  # plain text: one document per file, paragraph or line
    streaming: bool = False  # hub: stream instead of downloading the whole dataset
    max_tokens: int | None = None  # stop after this many tokens (required with streaming)
    tokenizer: str = "bytes"  # bytes | gpt2 | r50k_base | cl100k_base | o200k_base
    val_fraction: float = 0.05  # share of documents held out for validation
    split_seed: int = 1337  # which documents are held out
    # metadata "reuse": "machine": a run continued in place may change it (training/reuse.py)
    num_proc: int | None = field(default=None, metadata={"reuse": "machine"})  # tokenizer threads (None: per core)
    cache_dir: str | None = field(default=None, metadata={"reuse": "machine"})  # None: <headlab cache>/data

    def __post_init__(self) -> None:
        check_data_config(self)


def headlab_cache() -> Path:
    """headlab's cache folder: ``$HEADLAB_CACHE`` if set, else ``$XDG_CACHE_HOME/headlab``, else ``~/.cache/headlab``.

    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG base-directory specification says.
    """
    if os.environ.get("HEADLAB_CACHE"):
        return Path(os.environ["HEADLAB_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "headlab"


def data_cache_dir(cfg: DataConfig) -> Path:
    """Where prepared token files and downloads go: ``data.cache_dir``, else ``<headlab cache>/data``."""
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else headlab_cache() / "data"


def check_data_config(cfg: DataConfig) -> None:
    """Refuse settings that cannot work, naming the value and the fix, before any work."""
    if cfg.source not in SOURCES:
        raise ValueError(f"unknown data source {cfg.source!r}; choose one of: {', '.join(SOURCES)}")
    from data.tokenizers import VOCAB_SIZES  # tiktoken: only where a config is checked

    if cfg.tokenizer not in VOCAB_SIZES:  # before the plan reads its vocabulary
        raise ValueError(f"data.tokenizer={cfg.tokenizer!r}; choose one of: {', '.join(VOCAB_SIZES)}")
    if cfg.source in ("files", "hub") and not cfg.path:
        what = "a file, directory or glob" if cfg.source == "files" else "a dataset repo id"
        raise ValueError(f"data.source={cfg.source} needs data.path ({what})")
    if cfg.source == "url" and not cfg.url:
        raise ValueError("data.source=url needs data.url (the address of a text file)")
    if cfg.sample_by not in SAMPLE_BY:
        raise ValueError(f"data.sample_by={cfg.sample_by!r}; choose one of: {', '.join(SAMPLE_BY)}")
    if not 0.0 < cfg.val_fraction < 1.0:
        raise ValueError(f"data.val_fraction={cfg.val_fraction} must be between 0 and 1 (e.g. 0.05)")
    if cfg.streaming and cfg.max_tokens is None:
        raise ValueError("data.streaming=true needs a token budget: set data.max_tokens (e.g. 100_000_000)")
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        raise ValueError(f"data.max_tokens={cfg.max_tokens} must be a positive number of tokens")
    if cfg.num_proc is not None and cfg.num_proc < 1:
        raise ValueError(f"data.num_proc={cfg.num_proc} must be at least 1 (or null for one per core)")

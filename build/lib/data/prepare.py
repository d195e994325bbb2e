"""Documents -> token files: ``train.bin``, ``val.bin`` (numpy memmaps) and ``meta.json``.

The files live in ``<cache_dir>/<name>-<tokenizer>-<fingerprint>/``; the
fingerprint covers the source, the tokenizer and the split settings, so the
same settings reuse the directory at once and different ones get their own.
A directory appears only when complete: it is written under a temporary name
and renamed into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.config import DataConfig
from data.sources import load_documents, source_identity
from data.tokenizers import Tokenizer, get_tokenizer

FORMAT_VERSION = 1
SPLITS = ("train", "val")
# Settings that change the tokens written (cache_dir and num_proc do not).
_TOKEN_SETTINGS = (
    "source", "path", "subset", "split", "url", "text_column", "sample_by", "streaming",
    "max_tokens", "val_fraction", "split_seed",
)  # fmt: skip


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 holds ids below 65,536; larger vocabularies need uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def is_val(index: int, seed: int, fraction: float) -> bool:
    """Document-level split: a stable hash of (seed, index), so it also works while streaming."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


def settings_of(cfg: DataConfig, tokenizer: Tokenizer) -> dict:
    settings = {k: getattr(cfg, k) for k in _TOKEN_SETTINGS}
    settings.update(
        tokenizer=tokenizer.name,
        vocab_size=tokenizer.vocab_size,
        eot_id=tokenizer.eot_id,
        identity=source_identity(cfg),
        format=FORMAT_VERSION,
    )
    return settings


def prepared_dir(cfg: DataConfig, tokenizer: Tokenizer, settings: dict | None = None) -> Path:
    settings = settings if settings is not None else settings_of(cfg, tokenizer)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(os.path.expanduser(cfg.cache_dir)) / f"{cfg.name}-{tokenizer.name}-{digest}"


def prepare(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> Path:
    """Prepare (or reuse) the token files of ``cfg``; returns their directory."""
    tokenizer = tokenizer or get_tokenizer(cfg.tokenizer)
    settings = settings_of(cfg, tokenizer)  # stats the source files once
    target = prepared_dir(cfg, tokenizer, settings)
    if (target / "meta.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One preparer per directory: other processes (torchrun ranks on this node, a second
    # run) wait on the lock, with no timeout, then find the directory complete.
    with open(target.with_name(f".{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "meta.json").exists():
            return target
        _prepare_into(cfg, tokenizer, settings, target)
    return target


def _prepare_into(cfg: DataConfig, tokenizer: Tokenizer, settings: dict, target: Path) -> None:
    partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        meta = _write_tokens(cfg, tokenizer, partial, settings, target.name)
        (partial / "meta.json").write_text(json.dumps(meta, indent=2))  # the rename below makes it appear
        try:
            os.rename(partial, target)
        except OSError:  # another process finished the same directory first: keep theirs
            if not (target / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _tokenize(batch: dict, indices: list[int], tokenizer: Tokenizer, seed: int, fraction: float) -> dict:
    dtype = token_dtype(tokenizer.vocab_size)
    # numpy arrays, not lists: datasets stores them in Arrow several times faster
    ids = [np.array([*doc, tokenizer.eot_id], dtype=dtype) for doc in tokenizer.encode_batch(batch["text"])]
    return {
        "ids": ids,
        "n_bytes": [len(text.encode("utf-8")) for text in batch["text"]],
        "val": [is_val(i, seed, fraction) for i in indices],
    }


def _write_tokens(cfg: DataConfig, tokenizer: Tokenizer, folder: Path, settings: dict, name: str) -> dict:
    docs = load_documents(cfg)
    map_args = dict(
        batched=True,
        with_indices=True,
        remove_columns=["text"],
        fn_kwargs=dict(tokenizer=tokenizer, seed=cfg.split_seed, fraction=cfg.val_fraction),
    )
    streaming = not hasattr(docs, "__len__")
    if not streaming:  # map-style: tokenize in parallel; our own cache replaces datasets'
        workers = min(cfg.num_proc or os.cpu_count() or 1, len(docs))
        map_args.update(
            num_proc=workers if workers > 1 else None,  # None: in this process, no pool
            new_fingerprint=name,
            desc=f"tokenize ({tokenizer.name})",
        )
    tokens = docs.map(_tokenize, **map_args)

    dtype = token_dtype(tokenizer.vocab_size)
    counts = {split: {"tokens": 0, "bytes": 0, "documents": 0} for split in SPLITS}
    total = 0
    files = {split: open(folder / f"{split}.bin", "wb") for split in SPLITS}
    bar = tqdm(total=None if streaming else len(tokens), unit="doc", desc=f"write {cfg.name}")
    try:
        for ids, n_bytes, val in _rows(tokens):
            bar.update()
            if n_bytes == 0:
                continue  # an empty document adds nothing, not even an EOT
            split = "val" if val else "train"
            files[split].write(ids.astype(dtype, copy=False).tobytes())
            counts[split]["tokens"] += len(ids)
            counts[split]["bytes"] += int(n_bytes)
            counts[split]["documents"] += 1
            total += len(ids)
            if bar.n % 1000 == 0:
                bar.set_postfix(tokens=f"{total:,}")
            if cfg.max_tokens is not None and total >= cfg.max_tokens:
                break
    finally:
        bar.set_postfix(tokens=f"{total:,}")
        bar.close()
        for f in files.values():
            f.close()

    if total == 0:
        raise ValueError(f"the corpus of data.name={cfg.name!r} ({cfg.source}) is empty: it has no text")
    n_docs = sum(counts[split]["documents"] for split in SPLITS)
    for split in SPLITS:
        if counts[split]["tokens"] == 0:
            raise ValueError(
                f"the {split} split of data.name={cfg.name!r} is empty ({n_docs} documents, "
                f"data.val_fraction={cfg.val_fraction}); use more documents "
                f"(e.g. data.sample_by=paragraph) or another val_fraction"
            )
    return {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype.name,
        "splits": counts,
        "settings": settings,
        "config": asdict(cfg),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _rows(tokens) -> Iterator[tuple[np.ndarray, int, bool]]:
    """(token ids, text bytes, is validation) per document, in order."""
    for batch in tokens.with_format("numpy").iter(batch_size=1000):
        yield from zip(batch["ids"], batch["n_bytes"], batch["val"], strict=True)

"""Documents -> token files: ``train.bin``, ``val.bin`` (numpy memmaps) and ``meta.json``.

The files live in ``<data cache>/<name>-<tokenizer>-<fingerprint>/`` (``data.config.data_cache_dir``); the
fingerprint covers the source, the tokenizer and the split settings, so the
same settings reuse the directory at once and different ones get their own.
A directory appears only when complete: it is written under a temporary name
and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common.run_files import TMP_MARK, folder_lock, remove_leftovers, temporary_name
from data.config import DataConfig, data_cache_dir
from data.sources import check_source, load_documents, source_identity
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
    return data_cache_dir(cfg) / f"{cfg.name}-{tokenizer.name}-{digest}"


def prepare(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> Path:
    """Prepare (or reuse) the token files of ``cfg``; returns their directory."""
    check_source(cfg)  # a wrong data.path is named before a tokenizer's download can fail
    tokenizer = tokenizer or get_tokenizer(cfg.tokenizer)
    settings = settings_of(cfg, tokenizer)  # stats the source files once
    target = prepared_dir(cfg, tokenizer, settings)
    if (target / "meta.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One preparer per directory: other processes (torchrun ranks on this node, a second
    # run) wait on the lock, with no timeout, then find the directory complete.
    with folder_lock(target):
        if (target / "meta.json").exists():
            return target
        remove_stale_partials(target)
        with _stop_signals_interrupt():  # from the start: loading the source can take a while too
            _prepare_into(cfg, tokenizer, settings, target)
    return target


def remove_stale_partials(target: Path) -> list[Path]:
    """Half-written directories of ``target`` left by processes that died (their pid is gone)."""
    return remove_leftovers(target.parent, f".{target.name}{TMP_MARK}*")


def _prepare_into(cfg: DataConfig, tokenizer: Tokenizer, settings: dict, target: Path) -> None:
    partial = temporary_name(target)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        meta = _write_tokens(cfg, tokenizer, partial, settings)
        (partial / "meta.json").write_text(json.dumps(meta, indent=2))  # the rename below makes it appear
        try:
            os.rename(partial, target)
        except OSError:  # another process finished the same directory first: keep theirs
            if not (target / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _texts(docs) -> Iterator[str]:
    """The documents' texts in order, for map-style and streaming datasets alike."""
    for batch in docs.iter(batch_size=256):
        yield from batch["text"]


def _tokenized(docs, tokenizer: Tokenizer, cfg: DataConfig, threads: int) -> Iterator[tuple]:
    """Documents -> (token ids with the closing EOT, text bytes, is validation), in order.

    ``threads`` threads encode documents ahead (tiktoken releases the GIL) while this thread
    turns finished ones into arrays and the caller writes them: one process, nothing to leave
    behind, and Ctrl-C is handled between documents.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    pool = ThreadPoolExecutor(max_workers=threads)
    pending: deque = deque()

    def finished():
        index, text, future = pending.popleft()
        encoded = future.result()
        ids = np.empty(len(encoded) + 1, dtype=dtype)
        ids[:-1], ids[-1] = encoded, tokenizer.eot_id
        return ids, len(text.encode("utf-8")), is_val(index, cfg.split_seed, cfg.val_fraction)

    try:
        for index, text in enumerate(_texts(docs)):
            pending.append((index, text, pool.submit(tokenizer.encode_array, text)))
            if len(pending) >= 16 * threads:  # enough work queued to keep every thread busy
                yield finished()
        while pending:
            yield finished()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class PreparationInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during data preparation: nothing was kept, no process is left."""


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM ends preparation like Ctrl-C does: cleanly, through the same clean-up."""

    def interrupt(signum, frame):
        raise PreparationInterrupted(f"data preparation interrupted by signal {signum}; nothing was kept")

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_tokens(cfg: DataConfig, tokenizer: Tokenizer, folder: Path, settings: dict) -> dict:
    docs = load_documents(cfg)
    streaming = not hasattr(docs, "__len__")
    workers = cfg.num_proc or os.cpu_count() or 1
    dtype = token_dtype(tokenizer.vocab_size)
    counts = {split: {"tokens": 0, "bytes": 0, "documents": 0} for split in SPLITS}
    total = 0
    files = {split: open(folder / f"{split}.bin", "wb") for split in SPLITS}
    desc = f"tokenize {cfg.name} ({tokenizer.name}, {workers} thread{'s' if workers > 1 else ''})"
    bar = tqdm(total=None if streaming else len(docs), unit="doc", desc=desc)
    try:
        for ids, n_bytes, val in _tokenized(docs, tokenizer, cfg, workers):
            bar.update()
            if n_bytes == 0:
                continue  # an empty document adds nothing, not even an EOT
            split = "val" if val else "train"
            files[split].write(ids.tobytes())  # already the file's dtype
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


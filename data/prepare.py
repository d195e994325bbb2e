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
import logging
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
from data.sources import DownloadFailed, check_source, fetch_source, load_documents, source_identity
from data.tokenizers import Tokenizer, TokenizerUnavailable, get_tokenizer

log = logging.getLogger("headlab.data")

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


def data_tokenizer(cfg: DataConfig) -> Tokenizer:
    """``cfg``'s tokenizer. Offline, where its rank file cannot be downloaded, the source's text is fetched too
    (a URL's, kept): where that fails as well, one error names both downloads and the one fix that needs neither.
    The tokenizer's own fix (``data.tokenizer=bytes``) would lead straight to the source's error."""
    try:
        return get_tokenizer(cfg.tokenizer)
    except TokenizerUnavailable as tokenizer_err:
        try:
            fetch_source(cfg)
        except DownloadFailed as err:
            raise RuntimeError(
                f"data={cfg.name} needs two downloads and neither could be made: its text (data.url={err.url!r}: "
                f"{err.reason}) and the rank file of tokenizer {tokenizer_err.name!r} ({tokenizer_err.reason}); run "
                f"once with network access (both are kept), or, offline, download the file yourself and use "
                f"data.source=files data.path=<the file> data.tokenizer=bytes"
            ) from tokenizer_err
        raise


def prepare(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> Path:
    """Prepare (or reuse) the token files of ``cfg``; returns their directory."""
    return prepare_or_reuse(cfg, tokenizer)[0]


def prepare_or_reuse(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> tuple[Path, bool]:
    """The directory of ``cfg``'s token files, and whether this call prepared them (False: they were there)."""
    check_source(cfg)  # a wrong data.path is named before a tokenizer's download can fail
    tokenizer = tokenizer or data_tokenizer(cfg)
    settings = settings_of(cfg, tokenizer)  # stats the source files once
    target = prepared_dir(cfg, tokenizer, settings)
    if (target / "meta.json").exists():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    # One preparer per directory: other processes (torchrun ranks on this node, a second
    # run) wait on the lock, with no timeout, then find the directory complete.
    with folder_lock(target):
        if (target / "meta.json").exists():
            return target, False
        remove_stale_partials(target)
        with _stop_signals_interrupt() as stop:  # from the start: loading the source can take a while too
            _prepare_into(cfg, tokenizer, settings, target, stop)
    return target, True


def remove_stale_partials(target: Path) -> list[Path]:
    """Half-written directories of ``target`` left by processes that died (their pid is gone)."""
    return remove_leftovers(target.parent, f".{target.name}{TMP_MARK}*")


def _prepare_into(cfg: DataConfig, tokenizer: Tokenizer, settings: dict, target: Path, stop: _StopSignals) -> None:
    partial = temporary_name(target)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        meta = _write_tokens(cfg, tokenizer, partial, settings, stop)
        stop.check()
        (partial / "meta.json").write_text(json.dumps(meta, indent=2))  # the rename below makes it appear
        stop.target = target  # a signal from here on may come after the rename: then the directory is kept
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


class _StopSignals:
    """SIGTERM ends preparation like Ctrl-C does: cleanly, through the same clean-up.

    The handler raises where the signal lands, which is prompt. But a library may swallow that exception or turn
    it into another: ``datasets`` does while it imports (a module's import caught it and loading went on) and while
    it lists files (a FileNotFoundError). So the signal is also recorded: ``check()`` raises it at the next safe
    point (after loading, between documents, before the rename), and an error raised after it is the interruption.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.target: Path | None = None  # the prepared directory, once it is being renamed into place

    def message(self) -> str:
        if self.target is not None and (self.target / "meta.json").exists():  # the signal came after the rename
            return f"interrupted by signal {self.received} as data preparation finished; {self.target} was kept"
        return f"data preparation interrupted by signal {self.received}; nothing was kept"

    def interrupt(self, signum, frame) -> None:
        self.received = signum
        raise PreparationInterrupted(self.message())

    def check(self) -> None:
        if self.received is not None:
            raise PreparationInterrupted(self.message())


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[_StopSignals]:
    stop = _StopSignals()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            previous[sig] = signal.signal(sig, stop.interrupt)
    try:
        yield stop
    except Exception as error:  # raised by a library that caught the interruption: the interruption is the cause
        if stop.received is None:
            raise
        raise PreparationInterrupted(stop.message()) from error
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_tokens(cfg: DataConfig, tokenizer: Tokenizer, folder: Path, settings: dict, stop: _StopSignals) -> dict:
    docs = load_documents(cfg)
    stop.check()
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
            stop.check()
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
    if all(counts[split]["tokens"] for split in SPLITS):
        how = {"by": "document", "note": document_split_note(counts, cfg)}
    else:  # too few documents to hold some out: split the token stream as nanoGPT does
        counts = split_by_position(folder, counts, tokenizer, cfg)
        how = {"by": "position", "note": position_split_note(n_docs, total, cfg.val_fraction)}
        log.info(how["note"])
    return {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype.name,
        "splits": counts,
        "split": how,
        "settings": settings,
        "config": asdict(cfg),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# Splits. By document (the default): a document is wholly train or wholly val. By position (a source with too
# few documents for that, e.g. one text file): the first tokens train and the last val_fraction validate.


def train_tokens_by_position(n_tokens: int, val_fraction: float) -> int:
    """How many of ``n_tokens`` train in a split by position: nanoGPT's ``int(n * 0.9)`` at val_fraction=0.1."""
    return int(n_tokens * (1 - val_fraction))


def tokens_needed_by_position(per_split: int, val_fraction: float) -> int:
    """The fewest tokens whose split by position leaves each side ``per_split`` tokens or more."""
    # Both sides grow with n, so count up from a bound below the answer: the smaller side holds at most
    # n * its fraction + 1 tokens.
    n = max(2 * per_split, int((per_split - 1) / min(val_fraction, 1 - val_fraction)))
    while min(train := train_tokens_by_position(n, val_fraction), n - train) < per_split:
        n += 1
    return n


def source_label(config: dict) -> str:
    """The source as the user set it (``asdict(DataConfig)``, or meta.json's copy): what an error names."""
    if config["source"] == "url":
        return f"data.url={config['url']}"
    if config["source"] in ("files", "hub"):
        return f"data.path={config['path']}"
    return f"data.name={config['name']}"


def split_by_position(folder: Path, counts: dict, tokenizer: Tokenizer, cfg: DataConfig) -> dict:
    """Rewrite the token files of ``folder``, all of whose tokens went to one split, as the first and last
    tokens of the stream; returns the new counts. Documents cut by the split count on both sides."""
    whole = folder / "stream.bin"
    os.replace(folder / f"{next(s for s in SPLITS if counts[s]['tokens'])}.bin", whole)
    stream = np.memmap(whole, dtype=token_dtype(tokenizer.vocab_size), mode="r")
    cut = train_tokens_by_position(len(stream), cfg.val_fraction)
    if not 0 < cut < len(stream):
        raise ValueError(
            f"{source_label(asdict(cfg))} has {len(stream):,} tokens, too few to split "
            f"{split_percents(cfg.val_fraction)} by position: it needs at least "
            f"{tokens_needed_by_position(1, cfg.val_fraction):,}; use a longer text"
        )
    parts = {"train": stream[:cut], "val": stream[cut:]}
    for split, part in parts.items():
        part.tofile(folder / f"{split}.bin")
    val_bytes = text_bytes(parts["val"], tokenizer)
    all_bytes = sum(counts[split]["bytes"] for split in SPLITS)
    split_bytes = {"train": all_bytes - val_bytes, "val": val_bytes}
    new = {s: {"tokens": len(p), "bytes": split_bytes[s], "documents": documents_in(p, tokenizer.eot_id)}
           for s, p in parts.items()}  # fmt: skip
    del stream, parts  # the memory map closes before its file goes
    whole.unlink()
    return new


def text_bytes(ids: np.ndarray, tokenizer: Tokenizer, chunk: int = 1 << 20) -> int:
    """UTF-8 bytes of the text behind ``ids`` (EOTs are no text); a token's bytes are whole, so chunks add up."""
    total = 0
    for start in range(0, len(ids), chunk):
        piece = np.asarray(ids[start : start + chunk])
        total += len(tokenizer.decode_bytes(piece[piece != tokenizer.eot_id].tolist()))
    return total


def documents_in(ids: np.ndarray, eot_id: int) -> int:
    """Documents with tokens in ``ids``: one per EOT, plus one cut before its EOT."""
    return int(np.count_nonzero(ids == eot_id)) + int(len(ids) > 0 and ids[-1] != eot_id)


def split_percents(val_fraction: float) -> str:
    """``90/10`` for val_fraction=0.1."""
    return f"{round((1 - val_fraction) * 100, 6):g}/{round(val_fraction * 100, 6):g}"


def position_split_note(n_docs: int, n_tokens: int, val_fraction: float) -> str:
    """The console's line (and meta.json's) for a split by position."""
    percents = split_percents(val_fraction)
    if n_docs == 1:
        return f"1 document: split its {n_tokens:,} tokens {percents} by position, as nanoGPT does"
    held_out = percents.split("/")[1]
    return (
        f"{n_docs:,} documents, too few to hold {held_out}% out by document: split their {n_tokens:,} tokens "
        f"{percents} by position, as nanoGPT does"
    )


def document_split_note(counts: dict, cfg: DataConfig) -> str:
    """meta.json's line for a split by document."""
    n_docs = sum(counts[split]["documents"] for split in SPLITS)
    return (
        f"{n_docs:,} documents: {counts['val']['documents']:,} held out whole for validation "
        f"(data.val_fraction={cfg.val_fraction}, data.split_seed={cfg.split_seed})"
    )

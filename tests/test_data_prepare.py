"""Token files: exact round trips, deterministic disjoint splits, caching, atomic writes."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from helpers import DEAD_PID

import data.prepare as prepare_module
from data.config import DataConfig, data_cache_dir
from data.loader import PreparedData
from data.prepare import is_val, prepare, token_dtype
from data.tokenizers import EOT, Tokenizer, get_tokenizer

ALPHABET = "abcdefghij klmnop\nqrst uvwxyz é ü 中 文 🙂 \t.,;:()[]"


def write_corpus(folder: Path, n_docs: int = 40, seed: int = 0) -> list[str]:
    """n_docs text files with varied (multi-byte, multi-line) text; returns them in file order."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(n_docs):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(20, 400)))
        (folder / f"doc_{i:03d}.txt").write_text(text, encoding="utf-8")
        docs.append(text)
    return docs


def files_config(tmp_path: Path, corpus: Path, **overrides) -> DataConfig:
    fields = dict(
        name="test", source="files", path=str(corpus), tokenizer="bytes", val_fraction=0.25,
        num_proc=1, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    return DataConfig(**{**fields, **overrides})


def tiny_bpe() -> Tokenizer:
    """A real BPE tiktoken encoding built offline: byte tokens plus a few merges."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"ab", b"abc", b"  ", b" k", b"\xc3\xa9"):
        ranks[token] = len(ranks)
    encoding = tiktoken.Encoding(
        name="tiny_bpe", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={EOT: len(ranks)}
    )
    return Tokenizer("tiny_bpe", encoding)


def split_documents(prepared: PreparedData, tokenizer: Tokenizer, split: str) -> list[str]:
    ids = prepared.tokens[split].tolist()
    assert ids[-1] == tokenizer.eot_id, "every document ends with EOT"
    text = tokenizer.decode_bytes(ids).decode("utf-8")
    return text.split(EOT)[:-1]


@pytest.mark.parametrize("make_tokenizer", [lambda: get_tokenizer("bytes"), tiny_bpe], ids=["bytes", "bpe"])
def test_round_trip_gives_the_documents_back_exactly(tmp_path, make_tokenizer):
    docs = write_corpus(tmp_path / "corpus")
    tokenizer = make_tokenizer()
    cfg = files_config(tmp_path, tmp_path / "corpus")
    prepared = PreparedData(prepare(cfg, tokenizer))

    in_val = [is_val(i, cfg.split_seed, cfg.val_fraction) for i in range(len(docs))]
    assert 0 < sum(in_val) < len(docs)
    assert split_documents(prepared, tokenizer, "train") == [d for d, v in zip(docs, in_val) if not v]
    assert split_documents(prepared, tokenizer, "val") == [d for d, v in zip(docs, in_val) if v]
    if tokenizer.name == "tiny_bpe":  # the merges were used: fewer tokens than bytes + EOTs
        assert len(prepared.tokens["train"]) < prepared.meta["splits"]["train"]["bytes"]


def test_meta_counts_match_the_files_and_the_text(tmp_path):
    docs = write_corpus(tmp_path / "corpus")
    prepared = PreparedData(prepare(files_config(tmp_path, tmp_path / "corpus")))
    splits = prepared.meta["splits"]
    for split in ("train", "val"):
        size = (prepared.folder / f"{split}.bin").stat().st_size
        assert splits[split]["tokens"] * 2 == size  # uint16 for the 257-token byte vocabulary
    assert splits["train"]["documents"] + splits["val"]["documents"] == len(docs)
    assert splits["train"]["bytes"] + splits["val"]["bytes"] == sum(len(d.encode()) for d in docs)
    # bytes tokenizer: one token per byte plus one EOT per document
    assert splits["val"]["tokens"] == splits["val"]["bytes"] + splits["val"]["documents"]
    assert prepared.meta["dtype"] == "uint16" and prepared.meta["vocab_size"] == 257


def test_split_is_deterministic_and_depends_on_the_seed(tmp_path):
    write_corpus(tmp_path / "corpus")
    a = PreparedData(prepare(files_config(tmp_path / "a", tmp_path / "corpus")))
    b = PreparedData(prepare(files_config(tmp_path / "b", tmp_path / "corpus")))
    c = PreparedData(prepare(files_config(tmp_path / "c", tmp_path / "corpus", split_seed=7)))
    assert np.array_equal(a.tokens["val"], b.tokens["val"])
    assert np.array_equal(a.tokens["train"], b.tokens["train"])
    assert not np.array_equal(a.tokens["val"], c.tokens["val"])


def test_token_dtype_fits_the_vocabulary(tmp_path):
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(200019) == np.uint32
    # A vocabulary past 65,536 is written as uint32 and its large ids survive.
    ranks = {bytes([b]): b for b in range(256)}
    big = Tokenizer("big", tiktoken.Encoding("big", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                                             special_tokens={EOT: 70000}))  # fmt: skip
    docs = write_corpus(tmp_path / "corpus", n_docs=12)
    prepared = PreparedData(prepare(files_config(tmp_path, tmp_path / "corpus", val_fraction=0.5), big))
    assert prepared.meta["dtype"] == "uint32" and prepared.tokens["train"].dtype == np.uint32
    assert 70000 in prepared.tokens["train"]
    got = split_documents(prepared, big, "train") + split_documents(prepared, big, "val")
    assert sorted(got) == sorted(docs)


def test_same_settings_reuse_the_cache_without_tokenizing(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpus")
    cfg = files_config(tmp_path, tmp_path / "corpus")
    first = prepare(cfg)
    stamp = (first / "train.bin").stat().st_mtime_ns

    def must_not_run(*args, **kwargs):
        raise AssertionError("re-tokenized although the cache was complete")

    monkeypatch.setattr(prepare_module, "load_documents", must_not_run)
    assert prepare(cfg) == first
    assert (first / "train.bin").stat().st_mtime_ns == stamp


def test_different_settings_get_their_own_directory(tmp_path):
    write_corpus(tmp_path / "corpus")
    base = prepare(files_config(tmp_path, tmp_path / "corpus"))
    other_split = prepare(files_config(tmp_path, tmp_path / "corpus", val_fraction=0.5))
    other_tokenizer = prepare(files_config(tmp_path, tmp_path / "corpus"), tiny_bpe())
    assert len({base, other_split, other_tokenizer}) == 3
    # Editing the source changes the fingerprint too: stale tokens are never reused.
    (tmp_path / "corpus" / "doc_000.txt").write_text("changed text, longer than before")
    assert prepare(files_config(tmp_path, tmp_path / "corpus")) != base


class InterruptingTokenizer(Tokenizer):
    def encode_array(self, text):
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-way


def test_interrupted_preparation_leaves_nothing_that_looks_complete(tmp_path):
    write_corpus(tmp_path / "corpus")
    cfg = files_config(tmp_path, tmp_path / "corpus")
    cache = Path(cfg.cache_dir)
    # A leftover from a run killed earlier (no meta.json) must not be taken for a prepared directory.
    bytes_tok = get_tokenizer("bytes")
    leftover = cache / f".{prepare_module.prepared_dir(cfg, bytes_tok).name}.tmp-{DEAD_PID}"
    leftover.mkdir(parents=True)
    (leftover / "train.bin").write_bytes(b"\x00" * 10)

    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, InterruptingTokenizer("bytes", bytes_tok.encoding))
    assert list(cache.glob("*/meta.json")) == []
    assert not prepare_module.prepared_dir(cfg, bytes_tok).exists()

    prepared = PreparedData(prepare(cfg))  # a clean run afterwards works
    assert prepared.meta["splits"]["train"]["tokens"] > 0


def test_cli_prepares_and_reports_counts(tmp_path):
    from helpers import run_script

    write_corpus(tmp_path / "corpus", n_docs=10)
    result = run_script("-m data", "data=files", f"data.path={tmp_path / 'corpus'}", "data.tokenizer=bytes",
                        "data.val_fraction=0.3", f"data.cache_dir={tmp_path / 'cache'}", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.split("prepared: ")[1].splitlines()[0])
    meta = json.loads((folder / "meta.json").read_text())
    assert f"train: {meta['splits']['train']['tokens']:,} tokens" in result.stdout


def test_the_data_cache_is_headlab_cache_then_xdg_cache_home_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HEADLAB_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    assert data_cache_dir(DataConfig()) == tmp_path / "home" / ".cache" / "headlab" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_cache_dir(DataConfig()) == tmp_path / "xdg" / "headlab" / "data"
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "scratch"))
    assert data_cache_dir(DataConfig()) == tmp_path / "scratch" / "data"
    assert data_cache_dir(DataConfig(cache_dir=str(tmp_path / "mine"))) == tmp_path / "mine", "data.cache_dir wins"


@pytest.mark.slow
def test_the_cli_prepares_into_xdg_cache_home_and_leaves_home_alone(tmp_path):
    import os
    import subprocess
    import sys

    write_corpus(tmp_path / "corpus", n_docs=10)
    env = {k: v for k, v in os.environ.items() if k != "HEADLAB_CACHE"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    cmd = [sys.executable, "-m", "data", "data=files", f"data.path={tmp_path / 'corpus'}", "data.tokenizer=bytes"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parents[1], env=env)
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.split("prepared: ")[1].splitlines()[0])
    assert folder.parent == tmp_path / "xdg" / "headlab" / "data" and (folder / "meta.json").exists()
    assert not (tmp_path / "home" / ".cache").exists()

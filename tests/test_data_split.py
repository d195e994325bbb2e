"""Splits: by document when a source has enough documents, else the token stream by position as nanoGPT does."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from test_data_prepare import tiny_bpe, write_corpus

from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import is_val, prepare, tokens_needed_by_position, train_tokens_by_position
from data.tokenizers import get_tokenizer

SPEECH = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak. é 中\n\n"


def one_file(tmp_path: Path, text: str = SPEECH * 40) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(text, encoding="utf-8")
    return path


def files_config(tmp_path: Path, path: Path, **overrides) -> DataConfig:
    fields = dict(name="files", source="files", path=str(path), tokenizer="bytes", num_proc=1,
                  cache_dir=str(tmp_path / "cache"))  # fmt: skip
    return DataConfig(**{**fields, **overrides})


@pytest.mark.parametrize("make_tokenizer", [lambda: get_tokenizer("bytes"), tiny_bpe], ids=["bytes", "bpe"])
def test_one_text_file_trains_on_its_first_tokens_and_validates_on_the_last(tmp_path, make_tokenizer, caplog):
    path, tokenizer = one_file(tmp_path), make_tokenizer()
    with caplog.at_level(logging.INFO, logger="headlab.data"):
        prepared = PreparedData(prepare(files_config(tmp_path, path, val_fraction=0.1), tokenizer))

    stream = np.append(tokenizer.encode_array(path.read_text(encoding="utf-8")), tokenizer.eot_id)
    cut = int(len(stream) * 0.9)  # nanoGPT's split
    assert np.array_equal(prepared.tokens["train"], stream[:cut])
    assert np.array_equal(prepared.tokens["val"], stream[cut:])
    note = f"1 document: split its {len(stream):,} tokens 90/10 by position, as nanoGPT does"
    assert prepared.meta["split"] == {"by": "position", "note": note} and prepared.split_by == "position"
    assert note in caplog.messages, "the console says how the text was split"
    splits = prepared.meta["splits"]
    for split, ids in (("train", stream[:cut]), ("val", stream[cut:])):
        text_ids = ids[ids != tokenizer.eot_id].tolist()
        assert splits[split]["bytes"] == len(tokenizer.decode_bytes(text_ids)), "bits per byte stay exact"
        assert splits[split]["documents"] == 1, "the one document is cut in two"
    assert prepared.bytes_per_token("val") == splits["val"]["bytes"] / (len(stream) - cut)


def test_a_few_documents_all_in_one_split_are_split_by_position_in_their_order(tmp_path):
    docs = write_corpus(tmp_path / "corpus", n_docs=3)
    cfg = files_config(tmp_path, tmp_path / "corpus", val_fraction=0.05)
    assert not any(is_val(i, cfg.split_seed, cfg.val_fraction) for i in range(3)), "no document held out"
    prepared = PreparedData(prepare(cfg))

    both = np.concatenate([prepared.tokens["train"], prepared.tokens["val"]])
    assert get_tokenizer("bytes").decode_bytes(both.tolist()).decode() == "".join(d + "<|endoftext|>" for d in docs)
    assert len(prepared.tokens["train"]) == train_tokens_by_position(len(both), 0.05)
    assert prepared.split_note == (
        f"3 documents, too few to hold 5% out by document: split their {len(both):,} tokens 95/5 by position, "
        f"as nanoGPT does"
    )


def test_sources_with_enough_documents_keep_their_document_split(tmp_path):
    write_corpus(tmp_path / "corpus", n_docs=40)
    cfg = files_config(tmp_path, tmp_path / "corpus", val_fraction=0.25)
    prepared = PreparedData(prepare(cfg))
    n_val = sum(is_val(i, cfg.split_seed, cfg.val_fraction) for i in range(40))
    assert prepared.split_by == "document" and prepared.meta["splits"]["val"]["documents"] == n_val
    assert prepared.split_note.startswith(f"40 documents: {n_val} held out whole for validation")
    eot = get_tokenizer("bytes").eot_id
    assert prepared.tokens["val"][-1] == eot and prepared.tokens["train"][-1] == eot, "no document is cut"


def test_a_text_too_short_to_split_is_refused_naming_the_file_its_tokens_and_the_need(tmp_path):
    path = one_file(tmp_path, "a")  # 2 tokens: "a" and the EOT
    with pytest.raises(ValueError) as caught:
        prepare(files_config(tmp_path, path, val_fraction=0.6))
    assert str(caught.value) == (
        f"data.path={path} has 2 tokens, too few to split 40/60 by position: it needs at least 3; use a longer text"
    )
    assert not list((tmp_path / "cache").glob("*/meta.json")), "nothing that looks prepared is left"


def test_a_text_too_short_for_a_block_each_way_is_refused_with_the_tokens_it_needs(tmp_path):
    path = one_file(tmp_path, "x" * 399)  # 400 tokens with the EOT: 360 train, 40 validate
    prepared = PreparedData(prepare(files_config(tmp_path, path, val_fraction=0.1)))
    prepared.check_fits(block_size=39, vocab_size=257)
    needed = tokens_needed_by_position(41, 0.1)
    assert needed == 401  # int(401 * 0.9) = 360 train, 41 validate
    with pytest.raises(ValueError) as caught:
        prepared.check_fits(block_size=40, vocab_size=257)
    assert str(caught.value) == (
        f"data.path={path} has 400 tokens, split 90/10 by position: its val part has 40, fewer than "
        f"block_size + 1 = 41; it needs at least {needed} tokens at data.val_fraction=0.1; use a longer text or a "
        f"smaller block_size"
    )


@pytest.mark.parametrize("per_split", [1, 2, 41, 257, 1025])
@pytest.mark.parametrize("val_fraction", [0.005, 0.05, 0.1, 0.3, 0.5, 0.9])
def test_tokens_needed_is_the_fewest_that_give_each_side_enough(per_split, val_fraction):
    def enough(n: int) -> bool:
        train = train_tokens_by_position(n, val_fraction)
        return min(train, n - train) >= per_split

    needed = tokens_needed_by_position(per_split, val_fraction)
    assert enough(needed) and not enough(needed - 1)


def test_one_text_file_trains(tmp_path):
    from helpers import TINY, compose_train

    from training.loop import train

    path = one_file(tmp_path, SPEECH * 60)  # ~4,700 tokens: 32 + 1 each way with room
    summary = train(compose_train(*TINY, "data=files", f"data.path={path}", "trainer.max_steps=2",
                                  "trainer.eval_interval=2", "logger=none", f"trainer.run_dir={tmp_path / 'run'}",
                                  f"data.cache_dir={tmp_path / 'cache'}"))  # fmt: skip
    assert summary["step"] == 2 and np.isfinite(summary["val_loss"])


def test_python_m_data_says_prepared_then_reused(tmp_path):
    from helpers import run_script

    write_corpus(tmp_path / "corpus", n_docs=10)
    args = ("-m data", "data=files", f"data.path={tmp_path / 'corpus'}", "data.val_fraction=0.3",
            f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    first, second = run_script(*args, env=dict(os.environ)), run_script(*args, env=dict(os.environ))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    folder = first.stdout.split("prepared: ")[1].splitlines()[0]
    assert "reused" not in first.stdout
    assert second.stdout.splitlines()[0] == f"reused: {folder}" and "prepared" not in second.stdout
    assert "  split: 10 documents: " in second.stdout, "a reused folder still says how it was split"

"""Bad data input is a clear error that names the value and the fix."""

from __future__ import annotations

import json

import pytest

from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from data.sources import load_documents
from data.tokenizers import get_tokenizer


def cfg(tmp_path, **fields) -> DataConfig:
    defaults = dict(name="t", source="files", tokenizer="bytes", num_proc=1, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**defaults, **fields})


def prepared_corpus(tmp_path) -> PreparedData:
    for i in range(30):
        (tmp_path / f"{i}.txt").write_text(f"document number {i} " * 5)
    return PreparedData(prepare(cfg(tmp_path, path=str(tmp_path / "*.txt"), val_fraction=0.3)))


def test_unknown_tokenizer_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt3'; choose one of: bytes, cl100k_base, gpt2"):
        get_tokenizer("gpt3")


def test_downloaded_tokenizer_offline_names_the_remedies():
    with pytest.raises(RuntimeError, match="'gpt2' needs its rank file.*TIKTOKEN_CACHE_DIR.*data.tokenizer=bytes"):
        get_tokenizer("gpt2")


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.path='.*nowhere/\*.txt' matches no file"):
        load_documents(cfg(tmp_path, path=str(tmp_path / "nowhere" / "*.txt")))


def test_empty_corpus_is_refused(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("")
    with pytest.raises(ValueError, match="the corpus of data.name='t' .* is empty"):
        prepare(cfg(tmp_path, path=str(tmp_path / "*.txt")))
    assert not list((tmp_path / "cache").glob("*/meta.json"))


def test_a_document_too_short_to_split_by_position_is_refused(tmp_path):
    (tmp_path / "only.txt").write_text("a")  # one document: split by position (tests/test_data_split.py)
    with pytest.raises(ValueError, match=r"data.path=.*only.txt has 2 tokens, too few to split 40/60 by position"):
        prepare(cfg(tmp_path, path=str(tmp_path / "only.txt"), val_fraction=0.6))


def test_mixed_file_kinds_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text('{"text": "y"}\n')
    with pytest.raises(ValueError, match=r"mixes file kinds \['.jsonl', '.txt'\]"):
        load_documents(cfg(tmp_path, path=str(tmp_path)))


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(source="ftp"), "unknown data source 'ftp'; choose one of: pystdlib, files, url, hub, retrieval"),
        (dict(source="files", path=None), "data.source=files needs data.path"),
        (dict(source="url"), "data.source=url needs data.url"),
        (dict(source="hub", path="x/y", streaming=True), "streaming=true needs a token budget"),
        (dict(val_fraction=0.0), "data.val_fraction=0.0 must be between 0 and 1"),
        (dict(sample_by="sentence"), "data.sample_by='sentence'; choose one of: document, paragraph, line"),
    ],
)
def test_impossible_settings_are_refused_before_work(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**{"source": "pystdlib", **fields})


def test_split_shorter_than_a_block_is_refused(tmp_path):
    data = prepared_corpus(tmp_path)
    n_val = len(data.tokens["val"])
    data.check_fits(block_size=n_val - 1, vocab_size=257)
    with pytest.raises(ValueError, match=f"val split .* has {n_val} tokens, fewer than block_size \\+ 1 = {n_val + 1}"):
        data.check_fits(block_size=n_val, vocab_size=257)


def test_vocabulary_too_large_for_the_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'bytes' has 257 tokens but the model's vocab_size=256"):
        prepared_corpus(tmp_path).check_fits(block_size=8, vocab_size=256)


def test_files_that_do_not_match_meta_are_refused(tmp_path):
    data = prepared_corpus(tmp_path)
    train = data.folder / "train.bin"
    train.write_bytes(train.read_bytes()[:-2])  # one token short
    with pytest.raises(ValueError, match="train.bin holds .* tokens but meta.json says .*delete"):
        PreparedData(data.folder)


def test_a_folder_without_meta_is_not_prepared_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no meta.json"):
        PreparedData(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        PreparedData(tmp_path)

"""Text sources load through `datasets`; the network paths run on local files and fail clearly offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from data.sources import load_documents, stdlib_files
from data.tokenizers import EOT, get_tokenizer

DOCS = ["first document\nwith two lines\n", "second: ünïcödé 🙂", "third\n\nhas a blank line"]


def cfg(tmp_path: Path, **fields) -> DataConfig:
    defaults = dict(name="t", tokenizer="bytes", num_proc=1, cache_dir=str(tmp_path / "cache"), val_fraction=0.4)
    return DataConfig(**{**defaults, **fields})


def write_parquet(path: Path, column: str = "content") -> Path:
    pq.write_table(pa.table({column: DOCS, "id": list(range(len(DOCS)))}), path)
    return path


def write_jsonl(path: Path, column: str = "body") -> Path:
    path.write_text("".join(json.dumps({column: d, "n": i}) + "\n" for i, d in enumerate(DOCS)))
    return path


def test_text_files_keep_their_line_breaks_one_document_per_file(tmp_path):
    for i, doc in enumerate(DOCS):
        (tmp_path / f"{i}.txt").write_text(doc)
    docs = load_documents(cfg(tmp_path, source="files", path=str(tmp_path / "*.txt")))
    assert docs["text"] == DOCS


def test_text_files_by_paragraph(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n\nthree\n\n\nfour")
    docs = load_documents(cfg(tmp_path, source="files", path=str(tmp_path / "a.txt"), sample_by="paragraph"))
    assert [d.strip() for d in docs["text"]] == ["one\ntwo", "three", "four"]


@pytest.mark.parametrize("writer,column", [(write_parquet, "content"), (write_jsonl, "body")])
def test_parquet_and_jsonl_with_a_chosen_text_column(tmp_path, writer, column):
    suffix = ".parquet" if writer is write_parquet else ".jsonl"
    path = writer(tmp_path / f"docs{suffix}", column)
    docs = load_documents(cfg(tmp_path, source="files", path=str(path), text_column=column))
    assert docs.column_names == ["text"] and docs["text"] == DOCS


def test_missing_text_column_names_the_columns_there(tmp_path):
    path = write_parquet(tmp_path / "docs.parquet", "content")
    with pytest.raises(ValueError, match=r"no column 'text' \(it has \['content', 'id'\]\); set data.text_column"):
        load_documents(cfg(tmp_path, source="files", path=str(path)))


def test_url_source_downloads_once_into_the_cache(tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("To be, or not to be\n\nthat is the question:\nWhether 'tis nobler\n\nin the mind")
    config = cfg(tmp_path, source="url", url=source.as_uri(), sample_by="paragraph")
    prepared = PreparedData(prepare(config))
    downloads = list((tmp_path / "cache" / "downloads").iterdir())
    assert len(downloads) == 1 and downloads[0].name.endswith("-input.txt")
    assert downloads[0].read_text() == source.read_text()
    decoded = get_tokenizer("bytes").decode(prepared.tokens["train"].tolist() + prepared.tokens["val"].tolist())
    assert decoded.count(EOT) == 3


def test_url_that_cannot_be_reached_is_a_clear_error(tmp_path):
    # Port 9 (discard) on loopback: refused at once, as any unreachable host would fail.
    config = cfg(tmp_path, source="url", url="http://127.0.0.1:9/input.txt")
    with pytest.raises(RuntimeError, match="could not download data.url=.*data.source=files data.path="):
        load_documents(config)
    assert not list((tmp_path / "cache" / "downloads").glob("*")), "no partial download is left"


def test_hub_path_loads_a_local_dataset_folder_with_streaming_and_a_token_budget(tmp_path):
    repo = tmp_path / "my-dataset" / "data"
    repo.mkdir(parents=True)
    big = [f"story {i}: " + "once upon a time " * 20 for i in range(200)]
    pq.write_table(pa.table({"text": big}), repo / "train-00000-of-00001.parquet")
    config = cfg(tmp_path, source="hub", path=str(tmp_path / "my-dataset"), streaming=True,
                 max_tokens=5000, val_fraction=0.2)  # fmt: skip
    meta = PreparedData(prepare(config)).meta
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert 5000 <= total < 5000 + 1000 * len(big[0]), "stopped soon after the budget"
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] < len(big)


def test_hub_dataset_offline_is_a_clear_error(tmp_path):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(RuntimeError, match="could not load hub dataset 'someone/no-such-dataset'.*data=pystdlib"):
        load_documents(cfg(tmp_path, source="hub", path="someone/no-such-dataset"))


def test_pystdlib_is_the_standard_library_without_tests_in_a_fixed_order():
    files = stdlib_files()
    names = {Path(f).name for f in files}
    assert {"os.py", "functools.py", "__init__.py"} <= names
    assert files == sorted(files) or files == stdlib_files()  # deterministic
    for f in files:
        parts = Path(f).parts
        assert "site-packages" not in parts and "test" not in parts and "tests" not in parts


def test_pystdlib_corpus_prepares_with_bytes(tmp_path):
    prepared = PreparedData(prepare(cfg(tmp_path, source="pystdlib", num_proc=2)))
    counts = prepared.meta["splits"]
    assert counts["train"]["documents"] > 300 and counts["val"]["documents"] > 5
    assert counts["train"]["bytes"] > 5_000_000
    # the bytes tokenizer: every byte a token, every document closed by an EOT
    assert counts["train"]["tokens"] == counts["train"]["bytes"] + counts["train"]["documents"]
    assert np.count_nonzero(prepared.tokens["val"] == 256) == counts["val"]["documents"]

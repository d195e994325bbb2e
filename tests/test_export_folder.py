"""export.py leaves exactly its own files: an export into an earlier export's folder replaces it (no stale
tokenizer files), keeps and names the files export.py never writes, and refuses a folder that is not an export's."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from helpers import tiny_gpt_config

import export
from model import GPT, Checkpoint

BYTES_EXPORT = {"config.json", "model.safetensors", "headlab.json"}
GPT2_TOKENIZER_FILES = {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}


def checkpoint(folder: Path, tokenizer: str, vocab_size: int) -> Path:
    model = GPT(tiny_gpt_config(vocab_size=vocab_size))
    path = folder / f"{tokenizer}.pt"
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer=tokenizer).save(path)
    return path


def export_to(source: Path, out: Path) -> Path:
    return export.run(export.ExportConfig(source=str(source), out=str(out)))


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_a_bytes_model_exported_over_a_gpt2_export_leaves_no_gpt2_tokenizer_files(tmp_path, gpt2_tokenizer_offline,
                                                                                  capsys):  # fmt: skip
    out = tmp_path / "hf"
    export_to(checkpoint(tmp_path, "gpt2", 50257), out)
    assert names(out) == BYTES_EXPORT | GPT2_TOKENIZER_FILES
    capsys.readouterr()

    export_to(checkpoint(tmp_path, "bytes", 257), out)
    assert names(out) == BYTES_EXPORT, "exactly this export's files: no GPT-2 vocabulary for AutoTokenizer to read"
    assert json.loads((out / "headlab.json").read_text())["tokenizer"] == "bytes"
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 257
    err = capsys.readouterr().err
    assert "removed the earlier export's merges.txt, special_tokens_map.json, tokenizer_config.json, vocab.json" in err
    assert list(tmp_path.glob(".hf.tmp-*")) == [], "no staging folder is left"


def test_files_export_never_writes_are_kept_and_named(tmp_path, capsys):
    out = tmp_path / "hf"
    source = checkpoint(tmp_path, "bytes", 257)
    export_to(source, out)
    (out / "eval-pystdlib.json").write_text("{}")  # what evaluate.py writes beside the weights
    (out / "README.md").write_text("my model card")
    capsys.readouterr()

    export_to(source, out)
    assert names(out) == BYTES_EXPORT | {"eval-pystdlib.json", "README.md"}
    assert (out / "README.md").read_text() == "my model card"
    assert "kept README.md, eval-pystdlib.json: not written by export.py" in capsys.readouterr().err
    assert json.loads((out / "headlab.json").read_text())["files"] == ["config.json", "model.safetensors",
                                                                       "headlab.json"]  # fmt: skip


def test_a_folder_that_is_not_an_export_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "llama"}')  # another model's folder
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError) as caught:
        export_to(checkpoint(tmp_path, "bytes", 257), out)
    assert str(caught.value) == (
        f"out={out} is not empty (config.json, notes.txt) and holds no earlier export (headlab.json); give a new "
        f"or empty folder, or the folder of an earlier export to replace it"
    )
    assert names(out) == {"config.json", "notes.txt"} and (out / "config.json").read_text() == '{"model_type": "llama"}'
    assert list(tmp_path.glob(".mine.tmp-*")) == []


def test_an_empty_folder_takes_an_export(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    export_to(checkpoint(tmp_path, "bytes", 257), out)
    assert names(out) == BYTES_EXPORT

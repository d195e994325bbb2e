"""Local files train offline, as the Data table says; a wrong path is named before any tokenizer is loaded,
and a tokenizer that needs a download says in one line how to get it or how to do without it."""

from __future__ import annotations

import json
import os

import pytest
from helpers import TINY, compose_train, run_cli, run_script, write_text_corpus
from omegaconf import OmegaConf

from data.prepare import prepare
from data.tokenizers import get_tokenizer

TEXT = "document {i}: the quick brown fox jumps over the lazy dog, again and again.\n" * 20


def user_env(tmp_path) -> dict:
    """The test session's offline settings (conftest: no hub, an empty tiktoken cache), as a user would run:
    without HYDRA_FULL_ERROR, so errors are the one-line messages users see."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "empty-tiktoken-cache")  # nothing downloaded: gpt2 & co. fail
    return env


def test_data_files_defaults_to_the_offline_bytes_tokenizer():
    cfg = compose_train("data=files", "data.path=notes/")
    assert cfg.data.tokenizer == "bytes"


def test_data_files_prepares_with_no_download(tmp_path):
    corpus = write_text_corpus(tmp_path / "texts", 12, TEXT)
    result = run_script("-m data", "data=files", f"data.path={corpus}", f"data.cache_dir={tmp_path / 'cache'}",
                        env=user_env(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (meta,) = (tmp_path / "cache").glob("*/meta.json")
    assert json.loads(meta.read_text())["tokenizer"] == "bytes"
    assert "(bytes, uint16)" in result.stdout


def test_a_wrong_path_is_named_before_the_tokenizer_download_fails(tmp_path):
    """gpt2 cannot be loaded here (no rank file, no network): the path is still the one error reported."""
    result = run_cli(*TINY, "logger=none", "data=files", "data.path=nowhere/*.txt", "data.tokenizer=gpt2",
                     f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
                     cwd=tmp_path, env=user_env(tmp_path))  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (f"error: data.path='nowhere/*.txt' matches no file (looked in {tmp_path}/nowhere/*.txt); "
                         f"give an existing file, directory or glob (e.g. 'texts/**/*.txt')")  # fmt: skip
    assert "rank file" not in result.stderr and "Traceback" not in result.stderr


def test_a_tokenizer_that_needs_a_download_says_how_in_one_line(tmp_path):
    corpus = write_text_corpus(tmp_path / "texts", 12, TEXT)
    env = user_env(tmp_path)
    result = run_script("-m data", "data=files", f"data.path={corpus}", "data.tokenizer=cl100k_base",
                        f"data.cache_dir={tmp_path / 'cache'}", env=env)  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: tokenizer 'cl100k_base' needs its rank file, which tiktoken downloads once")
    cache = env["TIKTOKEN_CACHE_DIR"]
    assert f"set TIKTOKEN_CACHE_DIR to a folder holding the rank file (it looked in {cache})" in line
    assert line.endswith("offline, data.tokenizer=bytes needs no download")
    assert not list((tmp_path / "cache").glob("*/meta.json")), "nothing prepared"


def test_the_tokenizer_error_names_the_cache_folder_tiktoken_looked_in(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "ranks"))
    with pytest.raises(RuntimeError, match=f"it looked in {tmp_path / 'ranks'}"):
        get_tokenizer("o200k_base")


# Tiny Shakespeare's text from a URL that refuses at once, as no network does: the discard port of this machine.
UNREACHABLE_URL = "http://127.0.0.1:9/tinyshakespeare/input.txt"
FIX = "data.source=files data.path=<the file> data.tokenizer=bytes"


def test_tiny_shakespeare_offline_gives_the_one_fix_that_works(tmp_path):
    """data=tinyshakespeare downloads its text and GPT-2's ranks: offline neither comes. The error names both, and
    its fix needs neither (the tokenizer's fix alone, data.tokenizer=bytes, led straight to the download's error)."""
    options = ("data=tinyshakespeare", f"data.url={UNREACHABLE_URL}", f"data.cache_dir={tmp_path / 'cache'}")
    with pytest.raises(RuntimeError) as err:
        prepare(OmegaConf.to_object(compose_train(*options).data))
    said = str(err.value)
    assert said.startswith(f"data=tinyshakespeare needs two downloads and neither could be made: its text "
                           f"(data.url='{UNREACHABLE_URL}': ") and "the rank file of tokenizer 'gpt2'" in said, said
    assert said.endswith(f"offline, download the file yourself and use {FIX}"), said
    (tmp_path / "input.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 400)
    fixed = FIX.replace("<the file>", str(tmp_path / "input.txt")).split()
    meta = json.loads((prepare(OmegaConf.to_object(compose_train(*options, *fixed).data)) / "meta.json").read_text())
    assert meta["tokenizer"] == "bytes"


@pytest.mark.slow
def test_tiny_shakespeare_offline_gives_the_one_fix_that_works_on_the_command_line(tmp_path):
    """The same, as a user runs it: python -m data, its one line, then the line's fix."""
    env, cache, url = user_env(tmp_path), f"data.cache_dir={tmp_path / 'cache'}", UNREACHABLE_URL
    result = run_script("-m data", "data=tinyshakespeare", f"data.url={url}", cache, env=env)
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: data=tinyshakespeare needs two downloads and neither could be made: its text "
                           f"(data.url='{url}': ") and "the rank file of tokenizer 'gpt2'" in line, line  # fmt: skip
    assert line.endswith(f"offline, download the file yourself and use {FIX}"), line
    (tmp_path / "input.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 400)
    fixed = FIX.replace("<the file>", str(tmp_path / "input.txt")).split()
    result = run_script("-m data", "data=tinyshakespeare", f"data.url={url}", cache, *fixed, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("prepared: ") and "(bytes, uint16)" in result.stdout

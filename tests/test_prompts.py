"""A prompt is any text, as the shell passed it: code with parentheses and commas, spaces at its ends.

Hydra's override grammar refused ``prompt="def foo(x):"`` (``mismatched input '('``) and read ``prompt="a,b"``
as a sweep; sample.py and heads.py now take ``prompt=`` off the command line before Hydra. The documented
Hydra-quoted form (``prompt="'def '"``), ``prompt=-`` and ``prompt_file=`` keep working. Each case runs the
real script and checks, by the prompt's token count the script reports, that the model read exactly that text.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import run_script

from model import load_model


def sample_cli(run, *args: str, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    return run_script("sample.py", f"source={run}", "max_new_tokens=6", "device=cpu", *args, input=stdin,
                      timeout=120, cwd=cwd or os.getcwd())  # fmt: skip


def prompt_tokens(run, text: str) -> int:
    return len(load_model(str(run)).tokenizer.encode(text))


@pytest.mark.parametrize("argument,text", [
    ("prompt=def foo(x):", "def foo(x):"),  # Hydra: mismatched input '(' expecting <EOF>
    ("prompt=a,b", "a,b"),  # Hydra: Ambiguous value (a sweep)
    ("prompt=print('hi', end=\"\")", "print('hi', end=\"\")"),
    ("prompt=  x = {1: [2, 3]}  ", "  x = {1: [2, 3]}  "),  # Hydra strips the spaces at the ends
    ("prompt=${HOME} = 1e3", "${HOME} = 1e3"),  # no interpolation, no number
    ("prompt='def '", "def "),  # the README's Hydra-quoted form: its text, unquoted
    ("prompt=\"it's\"", "it's"),
])  # fmt: skip
def test_any_prompt_is_continued_exactly_as_typed(trained_run, argument, text):
    result = sample_cli(trained_run, argument)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(text), (result.stdout, text)
    assert f"({prompt_tokens(trained_run, text)}-token prompt)" in result.stderr, result.stderr


def test_a_prompt_file_holding_code_is_read_verbatim(trained_run, tmp_path):
    code = "def f(x, y):\n    return x\n"  # within the tiny model's 32 positions
    (tmp_path / "prompt.py").write_text(code)
    result = sample_cli(trained_run, f"prompt_file={tmp_path / 'prompt.py'}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(code)
    assert f"({prompt_tokens(trained_run, code)}-token prompt)" in result.stderr


def test_a_prompt_from_stdin_keeps_working(trained_run):
    result = sample_cli(trained_run, "prompt=-", stdin="f(a, b)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("f(a, b)")


def test_a_prompt_and_a_prompt_file_together_are_one_line(trained_run, tmp_path):
    (tmp_path / "p.txt").write_text("x")
    result = sample_cli(trained_run, "prompt=f(x)", f"prompt_file={tmp_path / 'p.txt'}")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"error: prompt='f(x)' and prompt_file='{tmp_path / 'p.txt'}' are both set; give one"]


@pytest.mark.slow
def test_heads_takes_a_prompt_of_code(trained_run, tmp_path, data_cache):
    result = run_script("heads.py", f"source={trained_run}", "windows=2", "prompt=for i in range(3):",
                        f"out={tmp_path / 'heads'}", "device=cpu", f"data.cache_dir={data_cache}",
                        cwd=os.getcwd())  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "heads" / "maps.png").is_file()

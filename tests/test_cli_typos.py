"""A mistyped option, in any script, is one line naming what was typed and the nearest valid names, before any work.

Every case runs the real script in a process of its own with real Hydra: the check reads the script's own schema and
config groups, so a typo in train.py, sample.py, evaluate.py, export.py, heads.py or ``python -m data`` is
caught the same way; ``+key=value`` for a key the schema does not know is refused, not silently added.
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import CONFIGS, ROOT, run_script

from cli import check_overrides

SCRIPTS = {
    "train": ["train.py"], "sample": ["sample.py", "source=x"], "evaluate": ["evaluate.py", "source=x"],
    "export": ["export.py", "source=x", "out=y"], "heads": ["heads.py", "source=x"], "data": ["-m data"],
}  # fmt: skip


def run(script: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    command, *fixed = SCRIPTS[script]
    return run_script(command, *fixed, *args, cwd=cwd, timeout=120)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert result.stdout == "", "refused before any work"
    return lines[0]


@pytest.mark.parametrize("script,typed,nearest", [
    ("train", "trainer.max_step=50", ["trainer.max_steps"]),
    ("train", "max_steps=50", ["trainer.max_steps"]),  # the key without its group
    ("train", "modle.n_head=2", ["model.n_head"]),
    ("sample", "promt=hello", ["prompt"]),
    ("sample", "promt=def f(x):", ["prompt"]),  # the key's typo first, though Hydra cannot read the value
    ("evaluate", "windws=3", ["windows"]),
    ("export", "checkpont=best.pt", ["checkpoint"]),
    ("heads", "data.tokenizr=bytes", ["data.tokenizer"]),
    ("data", "data.pth=corpus/", ["data.path"]),
])  # fmt: skip
def test_a_mistyped_key_names_the_nearest_valid_one(script, typed, nearest, tmp_path):
    line = one_line_error(run(script, typed, cwd=tmp_path if script != "data" else ROOT))
    assert typed in line and "no such option" in line
    for name in nearest:
        assert f"did you mean {name}" in line, line
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_an_appended_key_the_schema_does_not_know_is_refused_not_ignored(tmp_path):
    """Hydra's own advice for a typo is ``+trainer.max_step=50``, which then ran 1,000 steps, the typo ignored."""
    line = one_line_error(run("train", "+trainer.max_step=50", "trainer.plan=true", cwd=tmp_path))
    assert "+trainer.max_step=50" in line and "+ cannot add an option" in line and "trainer.max_steps" in line


def test_an_appended_key_that_exists_says_to_drop_the_plus(tmp_path):
    line = one_line_error(run("sample", "+top_k=5", cwd=tmp_path))
    assert "set it without the +: top_k=5" in line


@pytest.mark.parametrize("typed,nearest", [("attention=fused", "attention=fused_qkv"),
                                           ("kernel=sdpa_flsh", "kernel=sdpa_flash")])  # fmt: skip
def test_a_wrong_group_option_lists_the_valid_ones(typed, nearest, tmp_path):
    group = typed.partition("=")[0]
    line = one_line_error(run("train", typed, "trainer.plan=true", cwd=tmp_path))
    assert line.startswith(f"error: {typed} is not an option of {group}") and f"did you mean {nearest}" in line
    every = sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))
    assert line.endswith(f"({group}: {', '.join(every)})"), line


def test_a_data_source_typo_in_a_script_with_a_data_group(tmp_path):
    line = one_line_error(run("evaluate", "data=tinyshakspeare", cwd=tmp_path))
    assert "did you mean data=tinyshakespeare" in line


@pytest.mark.parametrize("script,typed,nearest", [("sample", "attention=fused", "fused_qkv"),
                                                  ("heads", "kernel=flexx", "flex")])  # fmt: skip
def test_a_scripts_own_attention_and_kernel_options_name_the_nearest(script, typed, nearest, tmp_path):
    """sample.py, evaluate.py and heads.py take attention=/kernel= as plain options: checked before loading."""
    line = one_line_error(run(script, typed, cwd=tmp_path))
    assert typed.partition("=")[2] in line and f"did you mean {nearest}?" in line


def test_a_group_of_train_py_is_not_an_option_of_sample_py(tmp_path):
    line = one_line_error(run("sample", "data=files", cwd=tmp_path))
    assert "data=files: no such option" in line and "source, prompt" in line


def test_a_value_of_the_wrong_type_is_one_line(tmp_path):
    line = one_line_error(run("train", "trainer.max_steps=many", cwd=tmp_path))
    assert "trainer.max_steps=many" in line and "Integer" in line


def test_a_schedules_share_of_too_short_a_context_is_one_line_before_any_folder(tmp_path):
    """Hydra resolves the run directory's name (the model's label) before train.py's main: the share that rounds
    down to nothing is said there, in one line, and no run directory is made."""
    line = one_line_error(run("train", "schedule=gpt_oss", "model.block_size=7", cwd=tmp_path))
    assert line == ("error: model.layer_kinds.L.window is a schedule's share of the context, model.block_size=7 / 8, "
                    "which rounds down to 0 (configs/schedule's windows and chunks are such shares); use "
                    "model.block_size=8 or more, or set model.layer_kinds.L.window to a positive number of positions")
    assert not (tmp_path / "runs").exists()


def test_several_values_without_multirun_say_add_m(tmp_path):
    line = one_line_error(run("train", "kernel=manual,sdpa", cwd=tmp_path))
    assert "kernel=manual,sdpa is several values: add -m" in line


def test_a_value_hydra_cannot_read_says_how_to_quote_it(tmp_path):
    line = one_line_error(run("export", "checkpoint=best(1).pt", cwd=tmp_path))
    assert "Hydra cannot read this value" in line and "checkpoint=\"'best(1).pt'\"" in line


@pytest.mark.slow
def test_valid_overrides_hydras_own_and_multirun_still_work(tmp_path):
    """What the check must let through: hydra.* keys and groups, ``++`` on an existing key, ``-m`` sweeps."""
    result = run("train", "++trainer.max_steps=7", "hydra.run.dir=" + str(tmp_path / "run"),
                        "hydra/launcher=basic", "trainer.plan=true", "logger=none", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "run: 7 steps" in result.stdout, result.stdout
    swept = run("train", "-m", "kernel=manual,sdpa", "trainer.plan=true", "logger=none",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    assert "error" not in swept.stderr


def test_python_m_data_help_names_itself_and_lists_only_its_options():
    result = run("data", "--help")
    assert result.returncode == 0, result.stderr
    assert "python -m data" in result.stdout and "__main__" not in result.stdout
    assert "attention" not in result.stdout and "kernel" not in result.stdout, "train.py's groups, refused here"
    sources = sorted(path.stem for path in (CONFIGS / "data").glob("*.yaml"))
    listed = next(line for line in result.stdout.splitlines() if line.startswith("data: "))
    assert [s.replace(" (default)", "") for s in listed.removeprefix("data: ").split(", ")] == sources


def path_hint(config_name: str, arg: str) -> str:
    """check_overrides' answer (in this process) to a script's command line of one bare argument."""
    import evaluate  # noqa: F401  (each script registers its config schema)
    import export  # noqa: F401
    import heads  # noqa: F401
    import sample  # noqa: F401

    with pytest.raises(SystemExit) as caught:
        check_overrides(config_name, f"python {config_name}.py", argv=[arg])
    return str(caught.value.code)


@pytest.mark.parametrize("config_name", ["sample", "evaluate", "export", "heads"])
def test_a_run_directory_given_alone_suggests_source(config_name, tmp_path, monkeypatch):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for arg in ("runs/x", "runs", str(tmp_path / "runs" / "x"), "last.pt", "./nowhere"):  # there, or looks like one
        hint = f"did you mean source={arg}?"
        assert path_hint(config_name, arg) == f"error: {arg!r} is not an option: give key=value; {hint}"
    assert path_hint(config_name, "my run/x").endswith("did you mean 'source=my run/x'?"), "quoted for the shell"
    assert path_hint(config_name, "foo").endswith("(e.g. foo=...)"), "a bare word is not taken for a path"


def test_train_py_has_no_source_to_suggest(tmp_path, monkeypatch):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    line = path_hint("train", "runs/x")
    assert line == "error: 'runs/x' is not an option: give key=value (python train.py --help lists every option)"


def test_sample_py_with_a_run_directory_alone_says_did_you_mean_source(tmp_path):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    result = run_script("sample.py", "runs/x", cwd=tmp_path)
    assert one_line_error(result) == "error: 'runs/x' is not an option: give key=value; did you mean source=runs/x?"


@pytest.mark.parametrize("argv", [
    ["model.layer_pattern=AB", "+model.layer_kinds.A={}", "+model.layer_kinds.B={}", "+model.layer_kinds.B.window=64",
     "model.layer_kinds.B.window=32"],
    ["model.layer_pattern=AB", "+model.layer_kinds.A={}", "+model.layer_kinds.B={window:8}",
     "~model.layer_kinds.B.window"],
    ["model.layer_pattern=AB", "++model.layer_kinds.A={}", "+model.layer_kinds.B={}",
     "++model.layer_kinds.B.window=16"],
    ["schedule=gemma3", "+model.layer_kinds.L.sparse_topk=16", "~model.layer_kinds.L.sparse_topk"],
])  # fmt: skip
def test_a_key_a_mapping_gained_earlier_on_the_line_may_be_changed_or_removed_later(argv):
    """Hydra applies the overrides in turn: what one adds to a mapping (a schedule's kinds), a later one may change,
    force or remove (as a refused resume's 'add ...' words may, after the user's own +). Checked, not refused."""
    import train  # noqa: F401  (registers the schema)

    check_overrides("train", "python train.py", argv=argv)


def test_removing_a_key_a_mapping_lacks_says_so(tmp_path):
    line = refusal_of(["schedule=gemma3", "~model.layer_kinds.L.sparse_topk"])
    assert line == ("error: ~model.layer_kinds.L.sparse_topk: model.layer_kinds.L.sparse_topk is not set, so there is "
                    "nothing to remove; drop ~model.layer_kinds.L.sparse_topk")  # fmt: skip
    line = refusal_of(["schedule=gemma3", "model.layer_kinds.L.sparse_topk=4"])
    assert line.endswith("is a new key of a mapping; add it with a +: +model.layer_kinds.L.sparse_topk=4")


def refusal_of(argv: list[str]) -> str:
    import train  # noqa: F401

    with pytest.raises(SystemExit) as caught:
        check_overrides("train", "python train.py", argv=argv)
    return str(caught.value.code)

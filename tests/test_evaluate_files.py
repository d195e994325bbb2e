"""evaluate.py writes only its own files, and loses none (issue 51).

- ``out=`` naming a checkpoint, a run's record, or any file evaluate.py did not write is refused before any
  work, the file untouched; so is ``out=`` holding evaluate.py's answer to another question;
- by default, another question (other lengths, protocol, options) gets the next free name, said on stderr; the
  same question replaces its own earlier result;
- a path-like ``data.name`` stays one part of a file name in the run directory;
- a full disk while the JSON or a plot is saved leaves the earlier file as it was, prints the result, and ends
  in one line naming the path and the disk's error;
- ``retrieval=[]`` is refused before any work.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
from pathlib import Path

import pytest

import evaluate
from cli import user_errors
from data.config import DataConfig


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A run directory of its own (the session's run's last.pt and run.json), for a test to write into."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("last.pt", "run.json"):
        shutil.copy(trained_run / name, folder / name)
    return folder


def config(run: Path, data_cache: Path, **options) -> evaluate.EvaluateConfig:
    return evaluate.EvaluateConfig(source=str(run), device="cpu", data=DataConfig(cache_dir=str(data_cache)),
                                   **options)  # fmt: skip


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("name, says", [
    ("last.pt", "out={out} is not a .json name: evaluate.py writes its result as JSON and its plots beside it; "
                "give e.g. out={folder}/last.json"),
    ("run.json", "out={out} exists and evaluate.py did not write it (a checkpoint, a run's record or another file): "
                 "it is kept; give a new name, e.g. out={folder}/run-2.json"),
    ("notes.json", "out={out} exists and evaluate.py did not write it"),
])  # fmt: skip
def test_out_naming_a_file_evaluate_did_not_write_is_refused_and_kept(run, data_cache, capsys, name, says):
    out = run / name
    if name == "notes.json":
        out.write_text('{"val/loss": 1.0}')  # looks like a result, but evaluate.py's mark is not in it
    before = out.read_bytes()
    with pytest.raises(ValueError) as err:
        evaluate.run(config(run, data_cache, out=str(out)))
    assert one_line(err).startswith(says.format(out=out, folder=run))
    assert out.read_bytes() == before and capsys.readouterr().out == "", "refused before any work"


def test_another_question_gets_the_next_free_name_and_the_same_question_replaces_its_own(run, data_cache, capsys):
    plain = evaluate.run(config(run, data_cache))
    first = run / "eval-last-pystdlib.json"
    assert json.loads(first.read_text())["written_by"] == "evaluate.py" and plain["question"]["windows"] == 8
    evaluate.run(config(run, data_cache, lengths=[16, 32]))
    second = run / "eval-last-pystdlib-2.json"
    assert json.loads(second.read_text())["question"]["lengths"] == [16, 32]
    assert (run / "eval-last-pystdlib-2.png").is_file() and not (run / "eval-last-pystdlib.png").exists()
    assert (f"[evaluate] {first} holds evaluate.py's result of another question (lengths unset there, [16, 32] "
            f"here; ") in capsys.readouterr().err  # fmt: skip
    os.utime(second, (0, 0))
    again = evaluate.run(config(run, data_cache, lengths=[16, 32]))
    assert second.stat().st_mtime > 0 and json.loads(second.read_text()) == again, "its own result, replaced"
    assert sorted(p.name for p in run.glob("eval-*")) == ["eval-last-pystdlib-2.json", "eval-last-pystdlib-2.png",
                                                           "eval-last-pystdlib.json"]  # fmt: skip
    assert json.loads(first.read_text()) == plain, "the first question's result is as it was"


def test_out_holding_another_questions_result_is_refused_naming_how_it_differs_and_a_free_name(run, data_cache):
    out = run / "mine.json"
    evaluate.run(config(run, data_cache, out=str(out), lengths=[16]))
    before = out.read_bytes()
    with pytest.raises(ValueError) as err:
        evaluate.run(config(run, data_cache, out=str(out), lengths=[16], protocol="sliding"))
    assert one_line(err) == (f"out={out} holds evaluate.py's result of another question (protocol chunks there, "
                             f"sliding here); it is kept: give another name, e.g. out={run}/mine-2.json, or remove "
                             f"it first")  # fmt: skip
    assert out.read_bytes() == before


def test_a_plot_evaluate_did_not_write_is_never_replaced(run, data_cache):
    (run / "mine.png").write_bytes(b"my own picture")
    with pytest.raises(ValueError) as err:
        evaluate.run(config(run, data_cache, out=str(run / "mine.json"), lengths=[16]))
    assert one_line(err).startswith(f"out={run / 'mine.json'} is new, but {run / 'mine.png'} exists and evaluate.py "
                                    f"did not write it")  # fmt: skip
    assert (run / "mine.png").read_bytes() == b"my own picture" and not (run / "mine.json").exists()


@pytest.mark.parametrize("name, part", [("../../x", "x"), ("/etc/passwd", "etc_passwd"), ("a/b c", "a_b_c"),
                                        ("..", "data")])  # fmt: skip
def test_a_path_like_data_name_is_one_part_of_a_file_name_in_the_run_directory(run, name, part):
    cfg = evaluate.EvaluateConfig(source=str(run), data=DataConfig(name=name))
    out = evaluate.default_out(cfg, run / "last.pt")
    assert out == run / f"eval-last-{part}.json" and out.resolve().parent == run.resolve()


def full_disk(monkeypatch, suffix: str) -> None:
    """Writing any temporary ``*<suffix>`` file fails as a full disk does, after writing part of it."""
    write_text, write_bytes = pathlib.Path.write_text, pathlib.Path.write_bytes

    def no_space(path, data, *args, **kwargs):
        if ".tmp-" in path.name:
            (write_text if isinstance(data, str) else write_bytes)(path, data[:10])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return (write_text if isinstance(data, str) else write_bytes)(path, data, *args, **kwargs)

    if suffix == ".json":
        monkeypatch.setattr(pathlib.Path, "write_text", no_space)
    else:
        import matplotlib.figure

        def savefig(fig, path, **kwargs):
            no_space(Path(path), b"\x89PNG half")

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)


@pytest.mark.parametrize("suffix", [".json", ".png"])
def test_a_full_disk_keeps_the_earlier_files_prints_the_result_and_ends_in_one_line(run, data_cache, monkeypatch,
                                                                                   capsys, suffix):  # fmt: skip
    out = run / "eval.json"
    evaluate.run(config(run, data_cache, out=str(out), lengths=[16]))
    before = {path.name: path.read_bytes() for path in run.glob("eval*")}
    capsys.readouterr()
    full_disk(monkeypatch, suffix)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # the user's view: one line, no traceback
    with pytest.raises(SystemExit) as err, user_errors(evaluate.USAGE):
        evaluate.run(config(run, data_cache, out=str(out), lengths=[16]))
    message = str(err.value.code)
    assert "\n" not in message
    if suffix == ".json":
        assert message == (f"error: could not write {out} (No space left on device); the earlier eval.json is as "
                           f"it was, and the result is printed above as JSON; free some space, or give out=<a file "
                           f"on another disk or a folder you can write to>")  # fmt: skip
        printed = capsys.readouterr().out.splitlines()
        assert json.loads(printed[-1])["lengths"][0]["length"] == 16, "nothing computed is lost"
    else:
        assert message == (f"error: could not write {run / 'eval.png'} (No space left on device); the result is in "
                           f"{out}; free some space and evaluate again to draw it")  # fmt: skip
        before.pop("eval.json")
        assert json.loads(out.read_text())["lengths"][0]["length"] == 16, "the result was written before the plot"
    assert {path.name: path.read_bytes() for path in run.glob("eval*.png")} == {
        name: data for name, data in before.items() if name.endswith(".png")}, "the earlier plot as it was"
    if suffix == ".json":
        assert out.read_bytes() == before["eval.json"], "the earlier result as it was"
    assert not list(run.glob(".*tmp-*")), "no temporary left behind"


def test_retrieval_naming_no_task_is_refused_before_any_work(run, data_cache, capsys):
    with pytest.raises(ValueError) as err:
        evaluate.run(config(run, data_cache, lengths=[16], retrieval=[]))
    assert one_line(err) == ("retrieval=[] names no task; give passkey or mqar or both (retrieval=[passkey,mqar]), "
                             "or leave retrieval out")  # fmt: skip
    assert capsys.readouterr().out == "" and not list(run.glob("eval*"))

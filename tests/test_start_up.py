"""Ctrl-C or SIGTERM while a script starts (its imports, the plan, building the model) is one line, saying that
nothing was started and to run the command again; the process ends by the signal (issue 60, item 10).

Real processes, signalled at a marker, never after a sleep: a cold ``python train.py`` (torch not yet imported)
stopped inside ``import torch`` by an import hook that writes a marker and waits there; a warm one
(tests/warm_python.py) stopped inside ``GPT.__init__`` or the plan, patched to do the same. What the scripts do
once their work has begun is tested where that work is: the trainer's stop after a step
(tests/test_what_users_see.py, tests/test_stop_anywhere.py), data preparation's clean-up
(tests/test_interrupted_preparation.py).
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, TINY, user_env

NOTHING_STARTED = "while starting, before any work: nothing was started; run the command again"


def entry_points() -> list[Path]:
    """Every script a user runs: the top-level files with a ``__main__`` block, and every package's __main__.py."""
    top = [p for p in sorted(ROOT.glob("*.py")) if 'if __name__ == "__main__":' in p.read_text()]
    return top + sorted(ROOT.glob("*/__main__.py"))


@pytest.mark.parametrize("script", entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_entry_point_guards_its_start_up_before_any_other_import(script):
    body = [node for node in ast.parse(script.read_text()).body
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]  # the docstring
    body = [node for node in body if not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    first, second = body[:2]
    assert isinstance(first, ast.ImportFrom) and first.module == "common.startup", \
        f"{script.name}: the first import is common.startup's guard"  # fmt: skip
    assert isinstance(second, ast.If) and "__main__" in ast.unparse(second.test), script.name
    assert ast.unparse(second.body[0]) == "guard_start_up()", f"{script.name}: armed before its other imports"


# A cold process, stopped inside ``import torch``: a finder writes the marker, then waits for the signal. With
# ``numpy_like``, it then fails the import with another error, as numpy's import does when a signal lands while its C
# module loads ("ImportError: cannot load module more than once per process").
INSIDE_IMPORT_TORCH = """
import importlib.abc, runpy, sys, time
class Stall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        open({marker!r}, "w").close()
        try:
            while True:
                time.sleep(0.01)
        except KeyboardInterrupt:
            if {numpy_like!r}:
                raise ImportError("cannot load module more than once per process") from None
            raise
sys.meta_path.insert(0, Stall())
{run}
"""


@pytest.mark.parametrize(("command", "sig", "numpy_like"), [
    ("train.py", signal.SIGINT, False),
    ("train.py", signal.SIGTERM, True),
    ("-m data", signal.SIGTERM, False),
], ids=["train.py-Ctrl-C", "train.py-SIGTERM-an-import-fails-after-it", "python-m-data-SIGTERM"])  # fmt: skip
def test_a_stop_signal_inside_import_torch_says_nothing_was_started_in_one_line(tmp_path, command, sig, numpy_like):
    marker = tmp_path / "inside-import-torch"
    if command == "-m data":
        run = "sys.argv[0] = 'data'; runpy.run_module('data', run_name='__main__', alter_sys=True)"
        said_by = "python -m data"
    else:
        run = f"sys.argv[0] = {str(ROOT / command)!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
        said_by = command
    code = INSIDE_IMPORT_TORCH.format(marker=str(marker), numpy_like=numpy_like, run=run)
    env = {**user_env(), "PYTHONPATH": str(ROOT)}
    # as a terminal starts a command: Ctrl-C is not ignored (pytest -n's workers may have been started ignoring it)
    proc = subprocess.Popen([sys.executable, "-c", code, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.time() + 120
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert marker.exists(), f"never reached import torch: {proc.communicate(timeout=60)[1][-2000:]}"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else sig.name
    assert err.splitlines() == [f"{said_by}: stopped by {name} {NOTHING_STARTED}"], err[-3000:]
    assert proc.returncode == -sig, "it ends by the signal, as Python ends a process Ctrl-C interrupted"
    assert not (tmp_path / "run").exists()


# A warm process, stopped at a moment of train.py's start-up after its imports: the function named is patched to
# write the marker and wait for the signal there.
AT_A_MOMENT = """
import importlib, runpy, sys, time
where = importlib.import_module({module!r})
for part in {owner!r}:
    where = getattr(where, part)
def stall(*args, **kwargs):
    open({marker!r}, "w").close()
    while True:
        time.sleep(0.01)
setattr(where, {name!r}, stall)
sys.argv[0] = {script!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(("moment", "logger", "sig"), [
    # the plan, before any folder but Hydra's: what the trainer's model proves, and then the folder it claimed
    pytest.param("training.preflight:planned_model", "logger=none", signal.SIGTERM, marks=pytest.mark.slow),
    ("training.loop:GPT", "logger=none", signal.SIGINT),  # the trainer's model, in the run directory it claimed
    pytest.param("wandb.sdk.wandb_run:Run._on_start", "logger.mode=offline", signal.SIGTERM,  # wandb, half started
                 marks=pytest.mark.slow),
], ids=["the-plan-SIGTERM", "building-the-model-Ctrl-C", "starting-wandb-SIGTERM"])  # fmt: skip
def test_a_stop_signal_while_train_py_starts_leaves_no_run_directory(tmp_path, data_cache, moment, logger, sig):
    module, path = moment.split(":")
    *owner, name = path.split(".")
    marker = tmp_path / "marker"
    code = AT_A_MOMENT.format(module=module, owner=owner, name=name, marker=str(marker), script=str(ROOT / "train.py"))
    run = tmp_path / "runs" / "run"
    # A fresh interpreter, as a terminal starts a command (Ctrl-C not ignored, whatever pytest's workers inherited),
    # not a fork of the warm one: in a whole suite run, a forked child once went on past its Ctrl-C
    env = {**user_env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, *TINY, logger, f"data.cache_dir={data_cache}",
                             f"hydra.run.dir={run}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.time() + 120
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert marker.exists(), proc.communicate(timeout=60)[1][-3000:]
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    said = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else sig.name
    # its last line (data preparation's progress may come before it), no traceback
    assert result.stderr.splitlines()[-1] == f"train.py: stopped by {said} {NOTHING_STARTED}", result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.returncode == -sig
    assert not result.stdout, "nothing else said (wandb's closing lines)"
    assert not (tmp_path / "runs").exists(), "the folder Hydra made for a run that never started is removed"

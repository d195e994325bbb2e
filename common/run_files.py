"""The files headlab writes: a run directory's names and lock, and the write-then-rename protocol.

A run directory (``train.py``'s output) holds::

    run.json        the resolved config, the facts reports need, status, segments (RUN_INFO)
    metrics.jsonl   one JSON record per step or evaluation, appended (METRICS)
    last.pt         the latest checkpoint; best.pt the best evaluation's (LAST, BEST)
    failure.json    why the run could not finish, e.g. out of memory (FAILURE)
    samples.txt     text generated at the end, under a ``--- step N ---`` line (SAMPLES: sample_entry, read_samples)
    train.log       Hydra's copy of the console, named after train.py (TRAIN_LOG)
    profile/        trainer.profile=true (PROFILE), holding:
      time_by_kind.json   milliseconds per step by kind of work (PROFILE_SUMMARY)
      time_by_kind.md     the same as a table (PROFILE_TABLE)
      trace.json          torch.profiler's Chrome trace (PROFILE_TRACE)
    .headlab-run    the owner file: created by a new run, locked by the process writing the run (OWNER)

Every file that is replaced rather than appended to is written under a temporary name beside it
(``.<name>.tmp-<pid>``) and renamed into place: a reader never sees half a file, and a kill leaves the
previous file as it was plus a temporary that the next run removes (``remove_leftovers``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

RUN_INFO = "run.json"
METRICS = "metrics.jsonl"
LAST, BEST = "last.pt", "best.pt"
FAILURE = "failure.json"
SAMPLES = "samples.txt"
TRAIN_LOG = "train.log"  # written by Hydra's job logging (configs/train.yaml), read by users
PROFILE = "profile"
PROFILE_SUMMARY = "time_by_kind.json"
PROFILE_TABLE = "time_by_kind.md"
PROFILE_TRACE = "trace.json"
WANDB_REBUILT = "wandb-rebuilt"  # rebuild_wandb.py's offline run
OWNER = ".headlab-run"

TMP_MARK = ".tmp-"  # temporaries are ".<name>.tmp-<pid>": the pid tells whether their writer is still alive


def temporary_name(path: Path, keep_suffix: bool = False) -> Path:
    """Where ``path`` is written before its rename: beside it (one file system, so the rename is atomic),
    hidden, and named after this process. ``keep_suffix``: ``.<stem>.tmp-<pid><suffix>``, for writers that
    choose the format by the suffix (matplotlib)."""
    if keep_suffix:
        return path.with_name(f".{path.stem}{TMP_MARK}{os.getpid()}{path.suffix}")
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def write_atomically(path: Path, write: Callable[[Path], object], keep_suffix: bool = False) -> Path:
    """``write(temporary)``, then rename it to ``path``; a failed write removes its temporary and leaves
    ``path`` as it was."""
    tmp = temporary_name(path, keep_suffix)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return write_atomically(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj: dict) -> Path:
    return write_text(path, json.dumps(obj, indent=2))


def rewrite_in_place(path: Path, text: str) -> None:
    """Overwrite ``path`` without a temporary copy, where a full disk has no room for one: only when the new text
    fits in the blocks the file already holds (writing there needs no free space, so it cannot stop halfway);
    otherwise the file is left as it was and OSError raised."""
    data = text.encode()
    if len(data) > os.stat(path).st_blocks * 512:
        raise OSError(errno.ENOSPC, f"no room to rewrite {path} in place ({len(data)} bytes)")
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()


def remove_husk(folder: Path, only: set[str]) -> None:
    """Remove ``folder`` where it holds nothing but the entries named ``only`` (what a command that wrote no run
    leaves: it would later look like one), then the folders above it that this leaves empty, inside the working
    directory (``runs/<date>/``, ``runs/``)."""
    if not folder.is_dir() or not {p.name for p in folder.iterdir()} <= only:
        return
    shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.absolute().parents:
        if parent == Path.cwd() or Path.cwd() not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:  # it holds other runs
            break


def sample_entry(step: int, text: str) -> str:
    """What samples.txt holds of one sample: its step's line, then the text."""
    return f"--- step {step} ---\n{text}\n"


def read_samples(run_dir: Path) -> dict[int, str]:
    """samples.txt's texts by step (a run continued in place samples again at its new last step); {} if none."""
    path = run_dir / SAMPLES
    if not path.exists():
        return {}
    samples: dict[int, str] = {}
    step = None
    for line in path.read_text().splitlines(keepends=True):
        head = re.fullmatch(r"--- step (\d+) ---\n", line)
        if head:
            step = int(head.group(1))
            samples[step] = ""
        elif step is not None:
            samples[step] += line
    return {step: text.removesuffix("\n") for step, text in samples.items()}


def read_json(path: Path) -> dict | None:
    """A JSON file's content, or None where it is missing or damaged."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but someone else's
        return True
    return True


def remove_leftovers(folder: Path, pattern: str) -> list[Path]:
    """Remove the temporaries matching ``pattern`` in ``folder`` (files or folders ``...<TMP_MARK><pid>``)
    whose process is gone."""
    removed = []
    for path in folder.glob(pattern):
        pid = path.name.rsplit(TMP_MARK, 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
    return removed


def remove_stale_checkpoints(folder: Path) -> list[Path]:
    """Temporary checkpoint files that killed processes left in ``folder``."""
    return remove_leftovers(folder, f".*.pt{TMP_MARK}*")


def create_owner(run_dir: Path) -> bool:
    """Create the owner file of a new run; False where it exists already (another run has it)."""
    try:
        os.close(os.open(run_dir / OWNER, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def lock_owner(run_dir: Path) -> int | None:
    """An exclusive lock on the run's owner file (a descriptor, held until closed or the process dies),
    or None where another process holds it."""
    fd = os.open(run_dir / OWNER, os.O_CREAT | os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def directory_in_use(run_dir: Path) -> bool:
    """Whether a process holds the run directory's lock (``lock_owner``) right now."""
    try:
        fd = os.open(run_dir / OWNER, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(folder: Path):
    """Wait (with no timeout) for the exclusive lock of ``folder``, a sibling file ``.<name>.lock``: one process
    at a time writes the folder."""
    with open(folder.with_name(f".{folder.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield

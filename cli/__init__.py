"""What the command-line scripts share: one-line errors for options that are renamed, missing or wrong."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from omegaconf.errors import MissingMandatoryValue


def refuse_renamed_options(renamed: dict[str, str], argv: list[str] | None = None) -> None:
    """Exit with a one-line error for an override spelled the old way, naming the new spelling.

    ``renamed`` maps an old key (``attention.kernel``) to the new one (``kernel``).
    """
    for arg in sys.argv[1:] if argv is None else argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in renamed:
            sys.exit(f"error: {key}={value} was renamed: use {renamed[key]}={value}")


_TAKEN: dict[str, str | None] = {}  # attention=/kernel= values taken off the command line before Hydra


def take_layout_options(names: tuple[str, ...] = ("attention", "kernel"), argv: list[str] | None = None) -> None:
    """Take ``attention=...`` and ``kernel=...`` off the command line; ``with_layout_options`` sets them later.

    The scripts share ``configs/`` with train.py, whose ``attention`` and ``kernel`` are config groups: Hydra
    would read ``attention=wrapper`` as a group choice and refuse it ("Could not override 'attention'"),
    and it cannot be forced as a value. Here they are plain options of the script's own config.
    """
    args = sys.argv if argv is None else argv
    kept = args[:1]
    for arg in args[1:]:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in names:
            _TAKEN[key.lstrip("+")] = None if value in ("null", "") else value
        else:
            kept.append(arg)
    args[:] = kept


def with_layout_options(cfg):
    """The composed config, with the ``attention``/``kernel`` values taken off the command line."""
    for key, value in _TAKEN.items():
        setattr(cfg, key, value)
    return cfg


# Where headlab's own code lives: errors raised there carry a message written for the user.
_OWN_CODE = tuple(str(Path(__file__).resolve().parents[1] / name) for name in
                  ("model", "data", "training", "analysis", "cli", "train.py", "sample.py", "heads.py",
                   "evaluate.py", "export.py", "compare.py", "bench.py"))  # fmt: skip


def _raised_by_headlab(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_CODE)


@contextlib.contextmanager
def user_errors(usage: str) -> Iterator[None]:
    """Turn the errors a user can fix (a bad or missing option, a missing file) into one line on stderr.

    Only errors headlab raised itself, with their fix in the message; anything from deep inside a
    library keeps its traceback, and ``HYDRA_FULL_ERROR=1`` keeps every traceback, as for Hydra's own.
    """
    try:
        yield
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM where headlab stops cleanly (data preparation)
        if not str(err):
            raise
        sys.exit(f"interrupted: {err}")
    except MissingMandatoryValue as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err.full_key or 'a required option'} is required; usage: {usage}")
    except (ValueError, OSError, RuntimeError) as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not _raised_by_headlab(err):
            raise
        sys.exit("error: " + " ".join(str(err).split()))  # one line


def check_at_least(option: str, value, low, hint: str = "") -> None:
    """``option=value`` must be >= ``low``; the error names the option as typed and the valid range."""
    if value is None or value < low:
        raise ValueError(f"{option}={value} must be at least {low}{hint}")


def check_choice(option: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{option}={value!r} is not one of: {', '.join(map(str, sorted(choices)))}")


def check_attention_and_kernel(attention: str | None, kernel: str | None) -> None:
    """A script's optional ``attention=`` / ``kernel=`` (run the weights in another layout or kernel)."""
    from model import ATTENTION_LAYOUTS, KERNELS

    if attention is not None:
        check_choice("attention", attention, ATTENTION_LAYOUTS)
    if kernel is not None and kernel.startswith("sdpa_") and kernel not in KERNELS:
        raise ValueError(f"kernel={kernel} is a training option (SDPA held to one implementation); here use "
                         f"kernel=sdpa (PyTorch chooses), or leave kernel unset: the checkpoint's own")  # fmt: skip
    if kernel is not None:
        check_choice("kernel", kernel, KERNELS)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with an error as one line naming the option and the fix, not the whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")

"""What the command-line scripts share: one-line errors for options that are renamed, missing or wrong."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

from cli.overrides import check_overrides, set_by  # noqa: F401  (re-exported: every script's first check)
from common.startup import StartupInterrupted, interruption


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


def take_text_options(names: tuple[str, ...] = ("prompt", "prompt_file"), argv: list[str] | None = None) -> None:
    """Take ``prompt=...`` (and ``prompt_file=...``) off the command line verbatim; ``with_layout_options`` sets them.

    A prompt is text, often code: Hydra's override grammar refuses ``def foo(x):`` (``mismatched input '('``),
    reads ``a,b`` as a sweep and strips spaces at the ends. Taken here, any text is the value as the shell
    passed it; a value quoted the Hydra way (``prompt="'def '"``) is unquoted as before, and ``null`` is unset.
    """
    args = sys.argv if argv is None else argv
    kept = args[:1]
    for arg in args[1:]:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in names:
            _TAKEN[key.lstrip("+")] = _as_text(value)
        else:
            kept.append(arg)
    args[:] = kept


def _as_text(value: str) -> str | None:
    if value == "null":
        return None
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # quoted for Hydra: its unquoted text
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException

        with contextlib.suppress(HydraException):
            parsed = OverridesParser.create().parse_override(f"text={value}").value()
            if isinstance(parsed, str):
                return parsed
    return value


def with_layout_options(cfg):
    """The composed config, with the values taken off the command line (``attention``, ``kernel``, ``prompt``)."""
    for key, value in _TAKEN.items():
        setattr(cfg, key, value)
    return cfg


# Where headlab's own code lives: errors raised there carry a message written for the user.
_OWN_CODE = tuple(str(Path(__file__).resolve().parents[1] / name) for name in
                  ("common", "model", "data", "training", "analysis", "cli", "train.py", "sample.py", "heads.py",
                   "evaluate.py", "export.py", "compare.py", "bench.py"))  # fmt: skip


def _raised_by_headlab(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_CODE)


def _resolver_refusal(err: BaseException) -> ValueError | None:
    """The ValueError a resolver of headlab's raised under OmegaConf's error (which re-raises it, keeping it only as
    the context of its own), or None."""
    while err is not None:
        if isinstance(err, ValueError) and not isinstance(err, OmegaConfBaseException) and _raised_by_headlab(err):
            return err
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def user_errors(usage: str, as_typed: Callable[[str], str] | None = None) -> Iterator[None]:
    """Turn the errors a user can fix (a bad or missing option, a missing file) into one line on stderr.

    Only errors headlab raised itself, with their fix in the message; anything from deep inside a
    library keeps its traceback, and ``HYDRA_FULL_ERROR=1`` keeps every traceback, as for Hydra's own.
    ``as_typed`` words the line in the options the command typed (``set_by``: which of them set the one named).
    """
    try:
        yield
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM where headlab stops cleanly (data preparation)
        if not str(err) or isinstance(err, StartupInterrupted):  # the start-up guard says it as the process ends
            raise
        sys.exit(f"interrupted: {err}")
    except MissingMandatoryValue as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err.full_key or 'a required option'} is required; usage: {usage}")
    except InterpolationResolutionError as err:  # a config resolver of headlab's refused a value (context_share)
        cause = _resolver_refusal(err)
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or cause is None:
            raise
        sys.exit("error: " + " ".join(str(cause).split()))
    except (ValueError, OSError, RuntimeError) as err:
        if interruption() is not None:  # raised by a library that a stop signal interrupted as the script started
            raise interruption() from err
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not _raised_by_headlab(err):
            raise
        message = " ".join(str(err).split())  # one line
        sys.exit("error: " + (as_typed(message) if as_typed else message))


def check_at_least(option: str, value, low, hint: str = "") -> None:
    """``option=value`` must be >= ``low``; the error names the option as typed and the valid range."""
    if value is None or value < low:
        raise ValueError(f"{option}={value} must be at least {low}{hint}")


def check_choice(option: str, value, choices) -> None:
    if value not in choices:
        near = difflib.get_close_matches(str(value), list(map(str, choices)), n=3, cutoff=0.5)
        mean = f"; did you mean {' or '.join(near)}?" if near else ""
        raise ValueError(f"{option}={value!r} is not one of: {', '.join(map(str, sorted(choices)))}{mean}")


def check_attention_and_kernel(attention: str | None, kernel: str | None) -> None:
    """A script's optional ``attention=`` / ``kernel=`` (run the weights in another layout or kernel)."""
    from model.registry import KERNELS, MIXERS, split_kernel_option

    if attention is not None:
        check_choice("attention", attention, MIXERS)
    held, backend = split_kernel_option(kernel) if kernel is not None else (None, "auto")
    if backend != "auto":
        raise ValueError(f"kernel={kernel} is a training option (SDPA held to one implementation); here use "
                         f"kernel={held} (PyTorch chooses), or leave kernel unset: the checkpoint's own")  # fmt: skip
    if kernel is not None:
        check_choice("kernel", kernel, KERNELS)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with an error as one line naming the option and the fix, not the whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")

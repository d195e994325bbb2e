"""What the command-line scripts share: one-line errors for options that were renamed or are missing."""

from __future__ import annotations

import sys


def refuse_renamed_options(renamed: dict[str, str], argv: list[str] | None = None) -> None:
    """Exit with a one-line error for an override spelled the old way, naming the new spelling.

    ``renamed`` maps an old key (``attention.kernel``) to the new one (``kernel``).
    """
    for arg in sys.argv[1:] if argv is None else argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in renamed:
            sys.exit(f"error: {key}={value} was renamed: use {renamed[key]}={value}")

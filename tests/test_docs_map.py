"""The map (docs/ARCHITECTURE.md) names only what exists: every path in backticks (a token with a slash) is a
file or folder of the repository, and every ``path::test_name`` a test defined in that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "ARCHITECTURE.md"


def named_paths(text: str) -> list[str]:
    """Backticked tokens that are repository paths: a slash, no spaces, no placeholder or override."""
    return [t for t in re.findall(r"`([^`\s]+)`", text) if "/" in t and not re.search(r"[<=]", t)]


def missing(text: str, root: Path) -> list[str]:
    gone = []
    for token in named_paths(text):
        path, _, test = token.partition("::")
        file = root / path
        if not file.exists():
            gone.append(token)
        elif test and not re.search(rf"^def {re.escape(test)}\(", file.read_text(), re.MULTILINE):
            gone.append(token)
    return gone


def test_every_path_and_test_the_map_names_exists():
    text = MAP.read_text()
    assert len(named_paths(text)) > 30  # the map names its files in backticks, or this test checks nothing
    assert not missing(text, ROOT), f"docs/ARCHITECTURE.md names what does not exist: {missing(text, ROOT)}"


def test_a_renamed_file_or_test_is_caught(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "gpt.py").write_text("def test_here():\n    pass\n")
    text = "`model/gpt.py` `model/gone.py` `model/gpt.py::test_here` `model/gpt.py::test_gone` `model.window`"
    assert missing(text, tmp_path) == ["model/gone.py", "model/gpt.py::test_gone"]

"""The README is a door and the guides in docs/ hold the depth; both stay true to the program.

Their commands run in test_readme_commands.py. Here: the README's shape (what a newcomer reads in ten minutes),
every link resolves, and the table of config groups names every option of every group that configs/ has.
"""

from __future__ import annotations

import re

import pytest
from helpers import CONFIGS, ROOT

DOCUMENTS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
DOOR = ["Set up", "Train", "Sample", "Compare", "Test", "Where to go next", "Results"]


def headers(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def slug(header: str) -> str:
    """GitHub's anchor for a header: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", header.lower()).replace(" ", "-")


def test_the_readme_is_a_door_a_newcomer_reads_in_minutes():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160, "the depth belongs in docs/"
    assert [h for h in headers(text) if h != "headlab"] == DOOR
    guides = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", text.split("## Where to go next")[1]))
    assert linked == guides, f"every guide is in the README's table: missing {sorted(guides - linked)}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_link_leads_somewhere(document):
    path = ROOT / document
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{document}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            anchors = {slug(h) for h in headers(linked.read_text())}
            assert anchor in anchors, f"{document}: link to {target}: no such section in {linked.name}"


def test_the_table_of_config_groups_names_every_option_of_every_group():
    text = (ROOT / "docs" / "training.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", text.split("| group | options |")[1].split("\n\n")[0], re.M)
    table = {group: {name for name in re.findall(r"`([a-z][\w]*)`", options)} for group, options in rows}
    groups = {p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name != "hydra"}
    assert set(table) == groups, f"groups: the table has {sorted(table)}, configs/ has {sorted(groups)}"
    for group in groups:
        options = {p.stem for p in (CONFIGS / group).glob("*.yaml")}
        assert options <= table[group], f"{group}: the table lacks {sorted(options - table[group])}"
        named = {n for n in table[group] if n not in options and n != group}
        assert not named, f"{group}: the table names {sorted(named)}, which are not options of {group}"


def test_the_sample_line_the_guide_quotes_is_the_shape_sample_py_prints(capsys):
    import torch

    import sample
    from model import GPTConfig

    text = " ".join((ROOT / "docs" / "sampling.md").read_text().split())
    quoted = re.search(r"`(\[sample\] first token after [^`]*)`", text).group(1)
    cfg = sample.SampleConfig(source="x", num_samples=1)
    marks = [(0.0, 0), (0.001, 1), (0.002, 2), (0.23, 199)]  # 199 tokens after the first, as the quote
    sample.report_speed(cfg, GPTConfig(), 4, marks, torch.device("cpu"), torch.float32, "eager")
    printed = capsys.readouterr().err.strip()
    shape = re.sub(r"\\?\d+(\\\.\d+)?", r"[\\d.]+", re.escape(quoted))
    assert re.fullmatch(shape, printed), f"the guide quotes {quoted!r}; sample.py prints {printed!r}"

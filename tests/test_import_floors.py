"""Imports go one way down the floors (issue 29, item 5): an AST scan of every module's imports, top-level and
inside functions, fails on an arrow up a floor or sideways between neighbours on one floor.

    scripts   train.py, sample.py, compare.py, ... (top-level), every package's __main__.py, hydra_plugins/
    measuring the measuring tools behind bench.py, bench_reference.py and gpu_story.py
    cli       the scripts' shared command-line helpers
    training | analysis   neighbours: the trainer and the reports read each other's files, never each other's code
    model     the GPT, attention layouts and kernels, checkpoints
    data      tokenizers, text sources, token files, the batch loader
    common    the run directory's files, name lookups, text tables, warm-up, wandb mode: imports none of the above

A module may import its own package and any package on a lower floor. Inside model/, the inference shortcuts
(packed heads, decoding, generation) depend on the model, never the reverse.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = "scripts"
FLOORS = [{"common"}, {"data"}, {"model"}, {"training", "analysis"}, {"cli"}, {"measuring"}, {SCRIPTS}]
PACKAGES = set().union(*FLOORS) - {SCRIPTS}

# (importing module, imported module): the arrows still up a floor, each with why it is left. An entry that the
# code no longer needs fails the test below: remove it with the arrow.
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    """Every module of the project: the packages, hydra_plugins, and the top-level scripts."""
    paths = [p for package in (*PACKAGES, "hydra_plugins") for p in (ROOT / package).rglob("*.py")]
    paths += ROOT.glob("*.py")
    return {module_name(p): p for p in sorted(paths)}


def floor_name(module: str, scripts: set[str]) -> str | None:
    """The package that stands for a module's floor; None for modules outside the project (torch, hydra...)."""
    top = module.split(".")[0]
    if module.split(".")[-1] == "__main__" or top == "hydra_plugins" or top in scripts:
        return SCRIPTS  # an entry point: ``python -m data`` is a script that lives in its package
    return top if top in PACKAGES else None


def floor_of(name: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if name in floor)


def imports(source: str, module: str) -> set[str]:
    """Every module named by an import anywhere in ``source`` (functions and ``if`` blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the importing module's own package
                found.add(module.split(".")[0])
            else:
                found.add(node.module)
    return found


def arrows_up(modules: dict[str, str]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a package on the importer's floor or above, other than its own."""
    scripts = {name for name in modules if "." not in name and floor_name(name, set()) is None}
    bad = set()
    for module, source in modules.items():
        here = floor_name(module, scripts)
        for target in imports(source, module):
            there = floor_name(target, scripts)
            if here is None or there is None or target.split(".")[0] == module.split(".")[0]:
                continue
            if floor_of(there) >= floor_of(here):
                bad.add((module, target))
    return bad


def floor_problems(up: set[tuple[str, str]], allowed: dict[tuple[str, str], str]) -> list[str]:
    """Arrows up that the allow-list does not explain, and allow-list entries that no arrow needs."""
    unexplained = [f"import up a floor (or to a neighbour on the same floor): {a} -> {b}" for a, b in sorted(up)
                   if (a, b) not in allowed]  # fmt: skip
    stale = [f"allow-list entry no longer needed, remove it from ALLOWED: {a} -> {b}" for a, b in sorted(allowed)
             if (a, b) not in up]  # fmt: skip
    return unexplained + stale


def test_no_import_goes_up_a_floor():
    sources = {name: path.read_text() for name, path in project_modules().items()}
    problems = floor_problems(arrows_up(sources), ALLOWED)
    assert not problems, "\n".join(problems)


def test_an_allow_list_entry_that_no_arrow_needs_fails():
    up = {("data.tokenizers", "model.registry")}
    assert floor_problems(up, {("data.tokenizers", "model.registry"): "why"}) == []
    assert floor_problems(set(), {("data.tokenizers", "model.registry"): "why"}) == [
        "allow-list entry no longer needed, remove it from ALLOWED: data.tokenizers -> model.registry"
    ]
    assert len(floor_problems(up, {})) == 1


# Inside model/: the inference shortcuts use the model; the model (GPT, attention, kernels, cache, positions...)
# never imports them. The package's __init__ re-exports ``generate``, so it is the one exception.
SHORTCUTS = {"model.decoding.packed", "model.decoding.steps", "model.decoding.generation"}


def test_the_model_does_not_import_its_inference_shortcuts():
    sources = {name: path.read_text() for name, path in project_modules().items() if name.startswith("model.")}
    reverse = sorted(
        f"{module} -> {target}"
        for module, source in sources.items()
        if module not in SHORTCUTS
        for target in imports(source, module)
        if any(target == s or target.startswith(s + ".") for s in SHORTCUTS)
    )
    assert not reverse, "the model imports an inference shortcut (it should be the other way): " + ", ".join(reverse)


def test_every_package_sits_on_a_floor():
    """A new package must be given a floor, or its imports go unchecked."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "configs"}
    assert packages <= PACKAGES | {"hydra_plugins"}, f"packages with no floor: {sorted(packages - PACKAGES)}"


def test_every_package_and_subpackage_is_installed():
    """pyproject.toml lists the packages a (non-editable) install copies: a subpackage left off would be missing from
    an installed headlab, while every test of an editable checkout passes."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader (the project supports 3.10 too)")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("**/__init__.py")
             if p.parts[len(ROOT.parts)] in PACKAGES | {"hydra_plugins"}}  # fmt: skip
    assert found - {"hydra_plugins"} <= listed, f"packages pyproject.toml does not install: {sorted(found - listed)}"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("data.tokenizers", "def f():\n    from model.registry import lookup\n",
         {("data.tokenizers", "model.registry")}),  # fmt: skip
        ("training.profiling", "import analysis.tables\n", {("training.profiling", "analysis.tables")}),
        ("analysis.wandb_report", "if True:\n    from training import run_log\n",
         {("analysis.wandb_report", "training")}),  # fmt: skip
        ("common.run_files", "from data.config import DataConfig\n", {("common.run_files", "data.config")}),
        ("data.__main__", "from cli import user_errors\nfrom training.loop import train\n", set()),
        ("model.load", "def f():\n    from data.tokenizers import get_tokenizer\n", set()),
        ("model.gpt", "from .packed import is_packed\nimport torch\n", set()),
    ],
)
def test_the_scan_sees_arrows_up_wherever_they_are(module, source, expected):
    """The checker itself: an import inside a function or an ``if`` counts; a script may import any floor."""
    assert arrows_up({module: source}) == expected

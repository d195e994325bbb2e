"""The run labels of today's settings, written down: every option setting alone (in every layer, spelled plain and
as a sweep's axis), every pair of settings, and every preset of the groups that set the model. A label names run
directories, sweep folders, report rows and wandb tags, so a run trained today must keep its name tomorrow:
tests/test_label_golden.py holds ``attention_label`` to ``golden_labels.json``, which this file writes
(`python tests/label_golden.py`), only on purpose (a label changed on purpose, or a new option's settings added;
`git diff tests/golden_labels.json` shows every name that moved)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_labels.json"
# the groups whose options set the model (each composed alone, as a preset or a sweep chooses it)
MODEL_GROUPS = ("model", "attention", "attention_2026", "kernel", "kv_cache", "length_variant", "mixing", "schedule",
                "score_mods", "experiment")  # fmt: skip


def labels() -> dict[str, str]:
    """Each case's name -> its label (``attention_label``)."""
    return {**setting_labels(), **preset_labels()}


def setting_labels() -> dict[str, str]:
    """Every option setting alone in every layer (plain, and as a sweep's axis), and every pair of settings."""
    from test_option_pairs import MODEL_OPTIONS, SETTINGS

    from model.config import LABEL_AXES, attention_label
    from model.registry import MIXERS

    out = {}
    for layout in sorted(MIXERS):
        for name, value, needs in SETTINGS:
            model = {"attention": layout, "kernel": "sdpa", "n_head": 4, **needs, name: value}
            out[f"{layout} {name}={value!r} {needs}"] = attention_label(model)
            out[f"{layout} {name}={value!r} {needs} shown"] = attention_label(model, show=(name, *needs))
        out[f"{layout} every axis shown"] = attention_label({"attention": layout, "kernel": "sdpa", "n_head": 4},
                                                           show=LABEL_AXES)  # fmt: skip
    for (a, va, na), (b, vb, nb) in itertools.combinations(SETTINGS, 2):
        if a != b and a not in MODEL_OPTIONS:
            model = {"attention": "fused_qkv", "kernel": "sdpa", "n_head": 4, **na, **nb, a: va, b: vb}
            out[f"{a}={va!r} {b}={vb!r}"] = attention_label(model)
    return out


def is_preset(case: str) -> bool:
    """Whether a case of the table is a preset's (``mixing=kimi_linear``), not a setting's (``wrapper window=3 {}``)
    or a pair's (``window=3 sinks=True``): named by a group that sets the model."""
    return case.split(" ")[0].split("=")[0] in MODEL_GROUPS


def preset_labels() -> dict[str, str]:
    """Every preset of the groups that set the model, composed as a command line chooses it (Hydra: 0.2 s each)."""
    from helpers import CONFIGS, compose_train
    from omegaconf import OmegaConf

    from model.config import LABEL_AXES, attention_label

    out = {}
    for group in MODEL_GROUPS:
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            model = OmegaConf.to_container(compose_train(f"{group}={path.stem}").model, resolve=True)
            out[f"{group}={path.stem}"] = attention_label(model)
            out[f"{group}={path.stem} every axis shown"] = attention_label(model, show=LABEL_AXES)
    return out


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parent), str(HERE)]
    table = labels()
    GOLDEN.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"{GOLDEN}: {len(table)} labels written; `git diff {GOLDEN.name}` shows every one that moved")

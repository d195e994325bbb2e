"""Run labels keep their names: every label of tests/golden_labels.json (every option setting alone in every layer,
every pair, every preset of the groups that set the model) is what ``attention_label`` spells today. A label names
run directories, sweep folders, report rows and wandb tags: a run trained before a change keeps its name after it."""

from __future__ import annotations

import json

import pytest
from label_golden import GOLDEN, is_preset, preset_labels, setting_labels


def assert_spelled_as_written(today: dict[str, str], preset: bool) -> None:
    golden = {case: label for case, label in json.loads(GOLDEN.read_text()).items() if is_preset(case) == preset}
    moved = [f"{case}: {golden[case]!r} is now {today[case]!r}" for case in golden
             if case in today and today[case] != golden[case]]  # fmt: skip
    gone = [case for case in golden if case not in today]
    assert golden and not moved and not gone, (
        f"{len(moved)} labels moved, {len(gone)} cases no longer exist (a run trained before keeps its name: if this "
        f"is meant, rewrite the table, `python tests/label_golden.py`, and say in the commit which names moved and "
        f"why):\n" + "\n".join(moved[:40] + gone[:10]))


def test_every_option_setting_and_pair_is_spelled_as_it_was():
    assert_spelled_as_written(setting_labels(), preset=False)


@pytest.mark.slow
def test_every_preset_is_spelled_as_it_was():
    assert_spelled_as_written(preset_labels(), preset=True)

"""A sweep's plan text (training/plan.py's ``plan_variants``): a row per variant, and each distinct plan once,
headed by every variant it covers."""

from __future__ import annotations

from helpers import TINY, compose_train
from omegaconf import OmegaConf

from training.plan import plan_variants


def variant(*overrides: str):
    return OmegaConf.to_object(compose_train(*TINY, "logger=none", *overrides))


def test_seeds_share_one_plan_and_another_batch_split_gets_its_own():
    text = plan_variants({"seed=1": variant("trainer.seed=1"), "seed=2": variant("trainer.seed=2"),
                          "micro=4": variant("trainer.micro_batch_size=4")})  # fmt: skip
    assert text.startswith("3 runs; estimates")
    rows = [line for line in text.splitlines() if line.startswith(("| seed", "| micro"))]
    assert [row.split(" | ")[1] for row in rows] == ["8 x 1", "8 x 1", "4 x 2"], "micro-batch x accumulation"
    headings = [line for line in text.splitlines() if line.startswith("--- ")]
    assert headings == ["--- seed=1; seed=2 ---", "--- micro=4 ---"]

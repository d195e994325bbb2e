"""Prepare token files ahead of training: ``python -m data data=tinyshakespeare``.

Prints the prepared directory and its token counts. Training prepares on demand
too; this command just does it first (e.g. on a machine with network access).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from cli import check_overrides, user_errors
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)


ConfigStore.instance().store(name="prepare_schema", node=PrepareConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare")
def main(cfg: DictConfig) -> None:
    with user_errors("python -m data [data=<source>] [data.key=value ...]"):
        data_cfg: DataConfig = OmegaConf.to_object(cfg.data)
        prepared = PreparedData(prepare(data_cfg))
    print(f"prepared: {prepared.folder}")
    for split, counts in prepared.meta["splits"].items():
        print(
            f"  {split}: {counts['tokens']:,} tokens, {counts['bytes']:,} bytes, "
            f"{counts['documents']:,} documents ({prepared.meta['tokenizer']}, {prepared.meta['dtype']})"
        )


if __name__ == "__main__":
    check_overrides("prepare", "python -m data")
    main()

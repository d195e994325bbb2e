"""Prepare token files ahead of training: ``python -m data data=tinyshakespeare``.

Prints the directory ("prepared" when this command wrote it, "reused" when an earlier
preparation with the same settings had), its token counts and how they were split.
Training prepares on demand too; this command just does it first (e.g. on a machine
with network access).
"""

from __future__ import annotations

from common.startup import guard_start_up

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

from dataclasses import dataclass, field

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from cli import check_overrides, user_errors
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare_or_reuse


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)


ConfigStore.instance().store(name="prepare_schema", node=PrepareConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare")
def main(cfg: DictConfig) -> None:
    with user_errors("python -m data [data=<source>] [data.key=value ...]"):
        data_cfg: DataConfig = OmegaConf.to_object(cfg.data)
        folder, fresh = prepare_or_reuse(data_cfg)
        prepared = PreparedData(folder)
    # "reused": the folder was there already (same source, tokenizer and split settings); nothing was tokenized
    print(f"{'prepared' if fresh else 'reused'}: {prepared.folder}")
    for split, counts in prepared.meta["splits"].items():
        documents = f"{counts['documents']:,} document{'' if counts['documents'] == 1 else 's'}"
        print(
            f"  {split}: {counts['tokens']:,} tokens, {counts['bytes']:,} bytes, "
            f"{documents} ({prepared.meta['tokenizer']}, {prepared.meta['dtype']})"
        )
    if prepared.split_note and not (fresh and prepared.split_by == "position"):  # preparing logged that one
        print(f"  split: {prepared.split_note}")


if __name__ == "__main__":
    check_overrides("prepare", "python -m data")
    main()

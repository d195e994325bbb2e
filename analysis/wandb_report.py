"""Put a local report (tables and PNGs) into wandb, beside the runs it describes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.wandb_mode import wandb_mode


def log_report(job_type: str, name: str, folder: Path, tables: dict[str, tuple[Sequence[str], Sequence[Sequence]]],
               images: Sequence[Path], logger: dict | None = None, mode: str = "auto") -> str:  # fmt: skip
    """One wandb run of ``job_type`` (``compare``, ``heads``) in the runs' project and group.

    ``logger`` is the runs' logger settings (project, entity, group) from their ``run.json``; ``mode``
    follows training's rules (offline without an API key). Returns the run's directory.
    """
    import wandb

    logger = logger or {}
    run = wandb.init(
        project=logger.get("project") or "headlab", entity=logger.get("entity"), group=logger.get("group"),
        name=name, job_type=job_type, dir=str(folder), mode=wandb_mode(mode),
        config={"report": str(folder)},
    )  # fmt: skip
    try:
        for key, (header, rows) in tables.items():
            run.log({key: wandb.Table(columns=list(header), data=[[_plain(v) for v in row] for row in rows])})
        run.log({path.stem: wandb.Image(str(path)) for path in images})
        return run.dir
    finally:
        run.finish()


def _plain(value):
    return None if isinstance(value, float) and value != value else value

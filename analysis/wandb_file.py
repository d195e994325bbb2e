"""Read a wandb offline run file (``run-<id>.wandb``): its protobuf records, without a wandb server.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic, version), then
32 KiB blocks of records, each with a 7-byte header (CRC, length, type) and a
``wandb_internal_pb2.Record`` payload, split across blocks when long.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

_HEADER, _BLOCK, _RECORD_HEADER = 7, 32 * 1024, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: str | Path) -> Iterator:
    """Every record of the file, in order (``wandb.proto.wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb run file (no ':W&B' header)")
    pos, pending = _HEADER, b""
    while pos + _RECORD_HEADER <= len(data):
        space = _BLOCK - pos % _BLOCK
        if space < _RECORD_HEADER:  # the block's tail is padding
            pos += space
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _RECORD_HEADER])
        if kind == 0:  # zeros: the rest of the block is empty
            pos += space
            continue
        chunk = data[pos + _RECORD_HEADER : pos + _RECORD_HEADER + length]
        pos += _RECORD_HEADER + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_complete(path: str | Path, timeout: float = 60.0) -> list:
    """Every record of a finished run's file, once wandb's writer has flushed it to the end.

    wandb writes the file from a service process that may still be flushing when ``finish()``
    returns; the run is complete when its ``exit`` record is there.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = list(read_records(path))
        except Exception:  # noqa: BLE001  (a record cut while being written)
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} has no exit record after {timeout:.0f} s: the run did not finish writing")
        time.sleep(0.2)


def history(path: str | Path) -> dict[int, dict]:
    """Logged values by step: ``{step: {key: value}}`` (tables and images as their JSON descriptions)."""
    steps: dict[int, dict] = {}
    for record in read_complete(path):
        if record.WhichOneof("record_type") == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            steps.setdefault(row.get("_step", record.history.step.num), {}).update(row)
    return steps

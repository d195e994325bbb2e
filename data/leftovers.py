"""What processes that died leave behind: temporary files and folders named ``<name><mark><pid>``.

Written under a temporary name and renamed when complete, nothing half-written is ever used;
a process killed before the rename leaves its temporary behind, and the next run removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but someone else's
        return True
    return True


def remove_leftovers(folder: Path, pattern: str, mark: str) -> list[Path]:
    """Remove what matches ``pattern`` in ``folder`` and was named ``...<mark><pid>`` by a dead process."""
    removed = []
    for path in folder.glob(pattern):
        pid = path.name.rsplit(mark, 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
    return removed

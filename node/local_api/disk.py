"""The disk a node's data uses: its SQLite database and its hop evidence, for ``/v1/status``.

Walking the evidence folder reads every file's size, too slow for each request and for the
node's loop on a long run's folder: ``watch_disk`` measures in a worker thread every
``DISK_PERIOD_S`` and leaves the result in the ``SnapshotBox``, where each snapshot picks it up.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import trio
from sqlalchemy.engine import Engine

from api.schemas import DiskUse
from node.local_api.snapshot import SnapshotBox

log = logging.getLogger(__name__)

DISK_PERIOD_S = 30.0
#: What SQLite keeps beside the database file while it writes (rollback journal, or WAL).
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")


@dataclass(frozen=True)
class DataPaths:
    """Where a node's data lies. None: it has none of that kind on this disk (a database
    server's files are the server's, not the node's)."""

    database: Path | None
    evidence: Path | None


def sqlite_file(engine: Engine) -> Path | None:
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def measure(paths: DataPaths, now: float) -> DiskUse:
    database = None
    if paths.database is not None:
        files = [paths.database, *(Path(f"{paths.database}{s}") for s in SQLITE_SIDECARS)]
        database = sum(_size(f) for f in files)
    evidence = folder_bytes(paths.evidence) if paths.evidence is not None else None
    return DiskUse(
        database_bytes=database,
        evidence_bytes=evidence,
        total_bytes=(database or 0) + (evidence or 0),
        measured_at=now,
    )


def folder_bytes(root: Path) -> int:
    """The sizes of the files under ``root`` (links not followed; 0 if it is not there). A
    file removed while it is walked (evidence being pruned) counts as gone."""
    total = 0
    for folder, _, names in os.walk(root):
        total += sum(_size(Path(folder) / name) for name in names)
    return total


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


async def watch_disk(box: SnapshotBox, paths: DataPaths, period_s: float = DISK_PERIOD_S) -> None:
    """Keep ``box.disk`` current; a failed measurement keeps the last and says so once."""
    failing = False
    while True:
        try:
            box.disk = await trio.to_thread.run_sync(measure, paths, time.time())
            failing = False
        except OSError as exc:
            if not failing:
                log.warning("the disk the node's data uses was not measured: %s", exc)
            failing = True
        await trio.sleep(period_s)

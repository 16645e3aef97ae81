"""The disk a node's data uses, kept current for ``/v1/status``: what ``gwtf.node.store.disk``
measures (its SQLite database with its journal, and its hop evidence), taken off the node's loop.

Walking the evidence folder reads every file's size, too slow for each request and for the
node's loop on a long run's folder: ``watch_disk`` measures in a worker thread every
``DISK_PERIOD_S`` and leaves the result in the ``SnapshotBox``, where each snapshot picks it up.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from gwtf.api.schemas import DiskUse
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.store.disk import sqlite_bytes
from gwtf.node.store.evidence import folder_bytes

log = logging.getLogger(__name__)

DISK_PERIOD_S = 30.0


@dataclass(frozen=True)
class DataPaths:
    """Where a node's data lies: its database's URL (a server's files are the server's, not
    the node's, and count as none) and its evidence folder (None: it keeps none)."""

    db_url: str
    evidence: Path | None


def measure(paths: DataPaths, now: float) -> DiskUse:
    database = sqlite_bytes(paths.db_url)
    evidence = folder_bytes(paths.evidence) if paths.evidence is not None else None
    return DiskUse(
        database_bytes=database,
        evidence_bytes=evidence,
        total_bytes=(database or 0) + (evidence or 0),
        measured_at=now,
    )


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

"""The disk a node's data takes: its database file (SQLite: the file with its write-ahead log
and shared memory) and its evidence folder (every run's), for ``status`` and the dashboard.

Cheap enough to call every few seconds: file sizes only (one ``stat`` per file, about 30 ms
for 10,000 evidence files, warm), no database connection, and nothing heavier than the standard
library imported, so a command line that shows it stays fast.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from gwtf.node.store.evidence import folder_bytes

_SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True)
class DiskUsage:
    #: The SQLite database's files; None when the database is not a local file (PostgreSQL,
    #: an in-memory SQLite).
    database_bytes: int | None
    evidence_bytes: int
    total_bytes: int


def disk_usage(db_url: str, evidence_dir: str | Path) -> DiskUsage:
    """The bytes under the node's database (``db.url``) and evidence folder
    (``chain.evidence_dir``; "" for none), and their sum. Missing files count 0."""
    database = sqlite_bytes(db_url)
    evidence = folder_bytes(Path(evidence_dir)) if str(evidence_dir) else 0
    return DiskUsage(database, evidence, (database or 0) + evidence)


def sqlite_bytes(db_url: str) -> int | None:
    """The bytes of a SQLite URL's database with its companion files, or None when the URL
    names no file (another database, or ``:memory:``)."""
    path = sqlite_path(db_url)
    if path is None:
        return None
    total = 0
    for suffix in _SQLITE_COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{path}{suffix}").st_size
    return total


def sqlite_path(db_url: str) -> str | None:
    """The file of ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (any driver,
    query left out), as SQLAlchemy reads it; None for other URLs and in-memory databases."""
    scheme, sep, rest = db_url.partition("://")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest.startswith("/"):
        return None
    path = unquote(rest[1:].partition("?")[0])
    if path in ("", ":memory:") or path.startswith("file::memory:"):
        return None
    return path

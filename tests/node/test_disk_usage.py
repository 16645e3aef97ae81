"""The disk a node's data takes, as ``status`` shows it: the SQLite database with its log, the
evidence folder of every run, and their sum."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gwtf.node.store.database import open_database
from gwtf.node.store.disk import disk_usage, sqlite_path
from gwtf.node.store.evidence import EvidenceArchive, run_folder


def files_bytes(*paths: Path) -> int:
    return sum(p.stat().st_size for path in paths for p in path.rglob("*") if p.is_file())


def test_the_database_and_every_run_s_evidence_are_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'node.sqlite'}"
    database = open_database(url)  # migrated: tables, and the write-ahead log beside it
    evidence = tmp_path / "evidence"
    for run in (1, 2):
        archive = EvidenceArchive(evidence / run_folder(31337, "0xAb", run, 1000), keep_epochs=2)
        archive.keep_frame(0, os.urandom(5000))
        archive.keep_state(0, 0, lambda: lambda path: path.write_bytes(b"w" * 40_000), bool)
        assert archive.state(0, 0) is not None  # written (in the archive's writer thread)
    try:
        usage = disk_usage(url, evidence)
        sqlite_files = [p for p in tmp_path.iterdir() if p.name.startswith("node.sqlite")]
        assert usage.database_bytes == sum(p.stat().st_size for p in sqlite_files) > 0
        assert usage.evidence_bytes == files_bytes(evidence) == 2 * (5000 + 40_000)
        assert usage.total_bytes == usage.database_bytes + usage.evidence_bytes
    finally:
        database.engine.dispose()


def test_nothing_there_yet_is_zero_and_a_remote_database_is_unknown(tmp_path: Path) -> None:
    fresh = disk_usage(f"sqlite:///{tmp_path / 'none.sqlite'}", tmp_path / "no-evidence")
    assert (fresh.database_bytes, fresh.evidence_bytes, fresh.total_bytes) == (0, 0, 0)
    remote = disk_usage("postgresql+psycopg://gwtf@db.example/gwtf", "")
    assert remote.database_bytes is None and remote.total_bytes == 0


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///.gwtf/node.sqlite", ".gwtf/node.sqlite"),
        ("sqlite:////var/lib/gwtf/node.sqlite", "/var/lib/gwtf/node.sqlite"),
        ("sqlite+pysqlite:///n%20ode.sqlite?timeout=5", "n ode.sqlite"),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("postgresql://u@h/db", None),
    ],
)
def test_the_file_of_a_database_url(url: str, path: str | None) -> None:
    assert sqlite_path(url) == path

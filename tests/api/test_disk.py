"""The disk a node's data uses: its SQLite database with its journal and its evidence folder,
measured off the node's loop every 30 s and served in ``/v1/status``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio
import trio.testing
from fastapi.testclient import TestClient

from gwtf.api.app import create_app
from gwtf.api.schemas import DiskUse
from gwtf.node.local_api.disk import DataPaths, measure, watch_disk
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.local_api.views import NodeViews
from gwtf.node.store.database import Database, open_database
from tests.api.conftest import TOKEN


def evidence_folder(root: Path) -> int:
    """Two runs' frames in nested folders, as a relay keeps them; their bytes."""
    sizes = {"run1/epoch0/a": 1000, "run1/epoch1/b": 2500, "run2/epoch0/c": 7}
    for name, size in sizes.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * size)
    return sum(sizes.values())


def test_the_database_file_and_every_evidence_file_are_counted(
    db: Database, tmp_path: Path
) -> None:
    on_disk = sum(f.stat().st_size for f in tmp_path.iterdir() if f.name.startswith("node.sqlite"))
    evidence = evidence_folder(tmp_path / "evidence")
    use = measure(DataPaths(str(db.engine.url), tmp_path / "evidence"), 123.0)
    assert use.database_bytes == on_disk > 0
    assert use.evidence_bytes == evidence
    assert use.total_bytes == on_disk + evidence and use.measured_at == 123.0


def test_what_the_node_does_not_keep_is_null() -> None:
    server = open_database("sqlite://")  # in memory: nothing on disk, as with a server
    try:
        use = measure(DataPaths(str(server.engine.url), None), 0.0)
    finally:
        server.close()
    assert (use.database_bytes, use.evidence_bytes, use.total_bytes) == (None, None, 0)


def test_the_disk_is_measured_every_30_s_and_shown_in_the_status(
    views: NodeViews, tmp_path: Path
) -> None:
    root = tmp_path / "evidence"
    evidence_folder(root)
    box = SnapshotBox()
    clock = trio.testing.MockClock()  # still unless jumped: the 30 s pass when the test says
    seen: list[int | None] = []

    async def measured_after(last: DiskUse | None) -> DiskUse:
        while box.disk is last:  # the measurement runs in a worker thread
            await trio.sleep(0)
        assert box.disk is not None
        return box.disk

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disk, box, DataPaths("", root))
            first = await measured_after(None)
            seen.append(first.evidence_bytes)
            (root / "run2" / "epoch0" / "d").write_bytes(b"y" * 500)
            clock.jump(29)
            for _ in range(100):
                await trio.sleep(0)
            assert box.disk is first  # not measured again before 30 s
            clock.jump(1)
            seen.append((await measured_after(first)).evidence_bytes)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert seen == [3507, 4007]

    # A snapshot carries the last measurement into /v1/status.
    snapshot = views.box.get()
    status = snapshot.status.model_copy(update={"disk": box.disk})
    views.box.snapshot = replace(snapshot, status=status)
    disk = TestClient(create_app(views, token=TOKEN)).get("/v1/status").json()["disk"]
    assert disk["evidence_bytes"] == disk["total_bytes"] == 4007
    assert disk["database_bytes"] is None

"""The node's local API at run time: its snapshot loop, chain watcher and server.

``run_local_api`` runs beside a started ``LiveNode`` (in its nursery) until cancelled: a status
snapshot every ``snapshot_period_s``, the chain's view of the run every ``chain_period_s`` (with
receipts on), and ``gwtf.api.app.create_app`` served on a socket bound before the node started.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import trio

from gwtf.api.app import create_app
from gwtf.api.services import Refused
from gwtf.node.local_api.client import socket_url
from gwtf.node.local_api.disk import DataPaths, watch_disk
from gwtf.node.local_api.server import ApiServer, serve_api
from gwtf.node.local_api.snapshot import Meter, SnapshotBox, take_snapshot
from gwtf.node.local_api.views import ClaimNow, NodeViews
from gwtf.node.local_api.watcher import ChainReader, watch_chain
from gwtf.node.receipts.book import address_of_peer
from gwtf.node.receipts.epochs import WorkerEpochs
from gwtf.node.runtime.live_node import LiveNode
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.store.views import NodeRecords


@dataclass(frozen=True)
class LocalApi:
    """A bound socket and the token, made before the node starts (``gwtf.node.composition``)."""

    sock: socket.socket
    token: str = field(repr=False)  # a secret: never in a log line
    snapshot_period_s: float = 1.0
    chain_period_s: float = 5.0

    @property
    def url(self) -> str:
        return socket_url(self.sock)


async def run_local_api(node: LiveNode, api: LocalApi, box: SnapshotBox) -> None:
    address = address_of_peer(node.plane.node_id)
    parts = node.receipts
    records = NodeRecords(parts.cycle.records.db) if parts is not None else None
    claim_now = None
    if parts is not None and isinstance(parts.cycle, WorkerEpochs):
        cycle = parts.cycle
        if cycle.ledger.wallet is not None:
            claim_now = _claims(cycle)
    views = NodeViews(
        box, records, node.config.run_id, address, claim_now, trio.lowlevel.current_trio_token()
    )
    server: ApiServer | None = None
    try:
        app = create_app(views, token=api.token, allowed_hosts=hosts_of(api.sock))
        server = serve_api(app, api.sock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disk, box, data_paths(node, records))
            if parts is not None and records is not None:
                ledger = parts.cycle.ledger
                reader = ChainReader(ledger.c, ledger, records, address)
                nursery.start_soon(watch_chain, box, reader, api.chain_period_s)
            meter = Meter()
            while True:
                box.snapshot = take_snapshot(node, box, meter)
                await trio.sleep(api.snapshot_period_s)
    finally:
        if server is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(server.stop)


def data_paths(node: LiveNode, records: NodeRecords | None) -> DataPaths:
    """Where the node keeps its data: its database (when a SQLite file) and, for a relay, the
    evidence folder holding every run's (the archive's root is this run's folder in it)."""
    database = str(records.db.engine.url) if records is not None else ""
    role = node.role
    evidence = role.evidence if isinstance(role, RelayRole) else None
    return DataPaths(database, evidence.root.parent if evidence is not None else None)


def hosts_of(sock: socket.socket) -> tuple[str, ...]:
    """The Host headers the API answers: its loopback names, or any when bound beyond them."""
    host = sock.getsockname()[0]
    if host in ("0.0.0.0", "::"):
        return ("*",)
    return tuple(dict.fromkeys((host, "127.0.0.1", "localhost", "::1", "[::1]")))


def _claims(cycle: WorkerEpochs) -> ClaimNow:
    async def claim_now(epoch: int | None) -> list[int]:
        if epoch is not None:
            times = await trio.to_thread.run_sync(cycle.ledger.epoch_times, epoch)
            if cycle.clock.now < times.settles_at:
                raise Refused(
                    f"epoch {epoch} settles at chain time {times.settles_at}, "
                    f"{times.settles_at - cycle.clock.now} s from now: claim it then"
                )
        asked = await cycle.claim_now(epoch)
        if not asked:
            which = f"epoch {epoch}" if epoch is not None else "any epoch"
            raise Refused(f"nothing is left to claim in {which}: every claim is settled")
        return asked

    return claim_now

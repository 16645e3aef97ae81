"""A node's local API over a real node database: receipts signed and countersigned as a relay
does, claims recorded as its epoch cycle does, a status snapshot and a chain reading."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from eth_account import Account
from eth_utils.crypto import keccak
from fastapi import FastAPI

from gwtf.api.app import create_app
from gwtf.api.schemas import (
    Amount,
    CapacityView,
    Health,
    HistoryPoint,
    NodeView,
    PeerView,
    RunView,
    Status,
)
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    HopReceipt,
    ledger_domain,
    scheduled_units,
    sign_receipt,
)
from gwtf.node.chain.epochs import EpochBook, EpochTimes, RewardPaid
from gwtf.node.local_api.earnings import ChainView
from gwtf.node.local_api.snapshot import ChainParts, NodeSnapshot, SnapshotBox
from gwtf.node.local_api.views import NodeViews
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import Database, open_database
from gwtf.node.store.ledger import LedgerRecords
from gwtf.node.store.views import NodeRecords
from tests.node.sealed_receipts import keep_sealed

TOKEN = "t" * 32
DOMAIN = ledger_domain(1, "0x" + "ab" * 20)
NODE, PEER = (Account.from_key(keccak(text=f"api test {who}")) for who in ("node", "peer"))
DATA_NODE = "0x" + "cd" * 20
UNITS = scheduled_units(0, 10)
EPOCH_S = 100
#: Epoch e runs [1000 + 100e, 1100 + 100e); submissions close 50 s later, it settles 600 s later.
WORKING = 9
NOW = 1000 + WORKING * EPOCH_S + 10  # epoch 0 has settled, epoch 9 is being worked


def times_of(epoch: int) -> EpochTimes:
    start = 1000 + EPOCH_S * epoch
    return EpochTimes(start, start + EPOCH_S, start + EPOCH_S + 50, start + EPOCH_S + 600)


def receipt(epoch: int, microbatch: int, worker: str, counterparty: str) -> HopReceipt:
    return HopReceipt(
        runId=1, epoch=epoch, dataNode=DATA_NODE, iteration=microbatch // 4,
        microbatchId=microbatch, stage=1, direction=microbatch % 2, attempt=0, worker=worker,
        counterparty=counterparty, inputDigest=b"\x01" * 32, outputDigest=b"\x02" * 32,
        units=UNITS,
    )  # fmt: skip


def fill(db: Database) -> None:
    """Epochs 0 and WORKING: 4 hops each as worker (3 countersigned), 2 countersigned for the peer.
    Epoch 0 is claimed (settled), its budget 1 ETH over 10 hops' units."""
    for epoch in (0, WORKING):
        add_work(db, epoch)
    LedgerRecords(db).save_claim(
        1, 0, DATA_NODE, NODE.address, 3 * UNITS, "confirmed", 3 * 10**17, b"\x0a" * 32
    )


def add_work(db: Database, epoch: int) -> None:
    """4 hops of ``epoch`` as worker (3 countersigned), 2 countersigned for the peer."""
    store = BatchStore(db, DOMAIN)
    own = [receipt(epoch, m, NODE.address, PEER.address) for m in range(4)]
    signed = [
        SignedReceipt(r, sign_receipt(r, DOMAIN, NODE.key), sign_receipt(r, DOMAIN, PEER.key))
        for r in own
    ]
    keep_sealed(store, signed[:3], WORKER)
    keep_sealed(store, [replace(signed[3], counterparty_signature=b"")], WORKER)
    theirs = [receipt(epoch, 100 + m, PEER.address, NODE.address) for m in range(2)]
    keep_sealed(
        store,
        [
            SignedReceipt(r, sign_receipt(r, DOMAIN, PEER.key), sign_receipt(r, DOMAIN, NODE.key))
            for r in theirs
        ],
        RECEIVER,
    )


def _signer(r: HopReceipt, key: bytes):  # type: ignore[no-untyped-def]
    return lambda: sign_receipt(r, DOMAIN, key)


def chain_parts() -> ChainParts:
    books = {
        0: EpochBook(10**18, 10 * UNITS, True, 3 * UNITS, 3 * 10**17, False),
        WORKING: EpochBook(0, 0, False, 0, 0, False),
    }
    paid = [RewardPaid(0, DATA_NODE, 3 * UNITS, 3 * 10**17, b"\x0a" * 32)]
    view = ChainView(NOW, {0: times_of(0), WORKING: times_of(WORKING)}, books, paid)
    run = RunView(
        run_id=1, sponsor=PEER.address, stage_count=2, epoch_length_s=EPOCH_S,
        challenge_window_s=600, units_per_hop=10, reward_per_epoch=Amount.of(10**18),
        hop_price=Amount.of(10**14),
        pool=Amount.of(5 * 10**18), min_stake=Amount.of(10**18), open=True, member=True,
        data_node=False,
    )  # fmt: skip
    node = NodeView(
        node=NODE.address, wallet=PEER.address, peer_id="16Uiu2x", status="active",
        stake=Amount.of(2 * 10**18), unlock_at=None, wallet_balance=Amount.of(10**18),
        capacity=CapacityView(gpu_model="cpu", memory_mib=4096, microbatches_per_hour=600,
                              max_in_flight=2),
    )  # fmt: skip
    return ChainParts(view, (run,), (), 3 * 10**17, 0, node=node)


def snapshot(chain: ChainParts) -> NodeSnapshot:
    now = time.time()
    status = Status(
        name="relay-1", node_address=NODE.address, peer_id="16Uiu2HAm" + "x" * 44,
        listen="/ip4/127.0.0.1/tcp/4001/p2p/16Uiu2HAm", role="relay", stage=1, stages=2,
        run_id=1, region="local", health=Health(status="ok"), iteration=7, epoch=WORKING,
        peers_alive=1, flows_in=1, flows_out=1, hops_computed=14, hops_recomputed=1,
        throughput_hops_per_s=2.5, loss=None, started_at=now - 60, updated_at=now,
    )  # fmt: skip
    peer = PeerView(
        peer_id="16Uiu2HAmpeer", node_address=PEER.address, role="relay", stage=2,
        region="local", alive=True, capacity=2, spare=1, compute_ms=80.0, latency_ms=0.5,
        place="downstream",
    )  # fmt: skip
    counters = {"hops_computed": 14.0, "peers_alive": 1.0, "rewards_claimed_eth": 0.3}
    history = tuple(
        HistoryPoint(t=now - 60 + i, throughput_hops_per_s=2.0 + i % 3, loss=None)
        for i in range(60)
    )
    return NodeSnapshot(status, (peer,), (), counters, history, chain)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(f"sqlite:///{tmp_path / 'node.sqlite'}")
    fill(database)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def views(db: Database) -> NodeViews:
    chain = chain_parts()
    box = SnapshotBox(snapshot(chain), chain)
    return NodeViews(box, NodeRecords(db), 1, NODE.address)


@pytest.fixture
def app(views: NodeViews, tmp_path: Path) -> FastAPI:
    return create_app(views, token=TOKEN, dashboard_dir=tmp_path / "no-dashboard")

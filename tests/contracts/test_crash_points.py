"""SIGKILL at the node's crash points, and a restart: a data node killed after its certificate
is mined submits it never again; a worker killed after its claim is mined never claims twice;
a receiver killed inside a receipt batch's transaction keeps every batch it committed whole and
none of the one it was writing. Each node runs in a process of its own (``crash_child``) against
the test's chain over JSON-RPC, and dies where ``GWTF_FAILPOINT`` says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gwtf.contracts.certificate_tree import PreparedHop
from gwtf.node.devnet.rpc import DevnetHttpServer, EthTesterRpc
from gwtf.node.failpoints import ENV
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore
from gwtf.node.store.ledger import LedgerRecords
from gwtf.node.store.models import Countersignature
from tests.contracts.conftest import Staffed
from tests.contracts.crash_child import STORE_DOMAIN, received_batch
from tests.contracts.test_node_epoch_cycle import chained_hops
from tests.contracts.world import STAGES, UNITS_PER_HOP, NodeKey

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rpc_url(staffed: Staffed) -> Iterator[str]:
    """The test's chain served over JSON-RPC, for the node processes."""
    server = DevnetHttpServer(EthTesterRpc(staffed.w.tester), "127.0.0.1", 0).start_background()
    try:
        yield server.url
    finally:
        server.stop()


def node_process(args: dict[str, Any], failpoint: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, ENV: failpoint}
    return subprocess.run(
        [sys.executable, "-m", "tests.contracts.crash_child", json.dumps(args)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def killed(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode == -signal.SIGKILL


def ran(result: subprocess.CompletedProcess[str]) -> bool:
    assert result.returncode == 0, result.stderr[-2000:]
    return True


def chain_args(
    s: Staffed, url: str, step: str, node: NodeKey, wallet: str, db: Path
) -> dict[str, Any]:
    return {
        "step": step, "url": url, "addresses": s.w.suite.addresses, "run": s.run,
        "address": node.address, "wallet": wallet, "db": str(db), "data_node": s.data.address,
    }  # fmt: skip


@pytest.mark.slow  # ~20 s: one node process SIGKILLed at each crash point
def test_a_node_killed_after_submitting_or_claiming_never_sends_it_twice(
    staffed: Staffed, rpc_url: str, tmp_path: Path
) -> None:
    s, w = staffed, staffed.w
    entries, anchors = chained_hops(s, w.register("ghost", w.stranger))
    data_db, worker_db = tmp_path / "data.sqlite", tmp_path / "a.sqlite"
    store = HopStore(open_database(f"sqlite:///{data_db}"))
    store.add_reported([PreparedHop.of(e, w.ledger_domain) for e in entries])
    store.add_anchors(anchors)
    w.to_submission(s.run, 0)
    submitted = w.ledger.events.CertificatesSubmitted

    settle = chain_args(s, rpc_url, "settle", s.data, w.sponsor, data_db)
    assert killed(node_process(settle, "epochs.after_submit"))
    assert len(submitted.get_logs(from_block=0)) == 1, "mined before the kill"
    records = LedgerRecords(open_database(f"sqlite:///{data_db}"))
    record = records.certificate(s.run, 0, s.data.address)
    assert record is not None and record.status == "pending"
    assert ran(node_process(settle))  # restarted: the chain says it is in, nothing is sent
    assert len(submitted.get_logs(from_block=0)) == 1
    record = records.certificate(s.run, 0, s.data.address)
    assert record is not None and record.status == "confirmed"

    w.to_settled(s.run, 0)
    claimed = w.ledger.events.RewardClaimed
    claim = {
        **chain_args(s, rpc_url, "claim", s.a, w.wallet(0), worker_db),
        "data_db": str(data_db),
    }
    assert killed(node_process(claim, "epochs.after_claim"))
    (mined,) = claimed.get_logs(from_block=0)
    worker_records = LedgerRecords(open_database(f"sqlite:///{worker_db}"))
    record = worker_records.claim(s.run, 0, s.data.address, s.a.address)
    assert record is not None and record.status == "pending"
    assert ran(node_process(claim))  # restarted: the claim on chain is recorded, not sent again
    assert claimed.get_logs(from_block=0) == [mined]
    record = worker_records.claim(s.run, 0, s.data.address, s.a.address)
    assert record is not None and record.status == "confirmed"
    assert record.tx_hash == bytes(mined["transactionHash"])
    assert record.amount_wei == str(mined["args"]["amountWei"])


def test_a_receiver_killed_mid_batch_keeps_each_committed_batch_whole_and_none_of_the_last(
    staffed: Staffed, tmp_path: Path
) -> None:
    s = staffed
    db = tmp_path / "b.sqlite"
    args = {
        "step": "countersign", "run": s.run, "db": str(db), "data_node": s.data.address,
        "worker": s.a.address, "worker_key": s.a.private_key.hex(), "address": s.b.address,
        "key": s.b.private_key.hex(),
    }  # fmt: skip
    # Killed inside the third batch's transaction, after its countersignatures, before the
    # whole receipts: the two batches before it had returned (their signatures were out).
    result = node_process(args, "store.mid_batch:3")
    assert killed(result)
    assert [json.loads(line)["committed"] for line in result.stdout.splitlines()] == [0, 5]
    store = HopStore(open_database(f"sqlite:///{db}"))
    kept = store.received_hops(s.run, 0)
    assert sorted(e.receipt.microbatchId for e in kept) == list(range(10))
    with store.db.sessions() as session:  # nor the countersignatures of the lost batch
        assert session.scalar(select(func.count()).select_from(Countersignature)) == 10
    # Restarted: the lost batch is signed as if new, the kept ones give their signatures again.
    terms = ReceiptTerms(s.run, STORE_DOMAIN, STAGES, UNITS_PER_HOP)
    again = store.countersign_once(received_batch(terms, 0, args))
    by_microbatch = {e.receipt.microbatchId: e for e in kept}
    assert again == [by_microbatch[m].counterparty_signature for m in range(5)]
    assert all(
        isinstance(x, bytes) for x in store.countersign_once(received_batch(terms, 10, args))
    )
    assert len(store.received_hops(s.run, 0)) == 15

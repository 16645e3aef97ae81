"""A node's earnings as its local API reads them from the real contracts (``ChainReader``): work
that no certificate covers once submissions closed shows as missed, with the data node that
certified nothing of it; work a certificate covers does not; the next claim is due when the
oldest epoch with work settles."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gwtf.api.schemas import EpochEarnings
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.local_api.earnings import earnings_of
from gwtf.node.local_api.snapshot import ChainParts
from gwtf.node.local_api.watcher import OPEN_BOOK_READ_S, ChainReader
from gwtf.node.store.batches import WORKER, BatchStore
from gwtf.node.store.database import Database, open_database
from gwtf.node.store.views import NodeRecords
from tests.contracts.conftest import Staffed
from tests.contracts.world import EPOCH_S, TEST_GAS_LIMIT, WINDOW_S, World
from tests.node.sealed_receipts import keep_sealed


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(f"sqlite:///{tmp_path / 'relay.sqlite'}")
    try:
        yield database
    finally:
        database.close()


def keep_worked(db: Database, w: World, hops: list[SignedReceipt]) -> int:
    """The hops as their worker's node keeps them: in batches their receivers countersigned.
    Their units."""
    keep_sealed(BatchStore(db, w.ledger_domain), hops, WORKER)
    return sum(h.receipt.units for h in hops)


def read(s: Staffed, db: Database) -> ChainParts:
    w = s.w
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)
    reader = ChainReader(
        contracts, EpochLedger(contracts, s.run, None), NodeRecords(db), s.a.address
    )
    return reader.read()


def epoch_zero(s: Staffed, db: Database) -> EpochEarnings:
    (epoch,) = earnings_of(s.run, NodeRecords(db).work(s.run), [], read(s, db).view)
    assert epoch.epoch == 0
    return epoch


def test_the_next_claim_is_when_the_epochs_with_work_settle(staffed: Staffed, db: Database) -> None:
    s, w = staffed, staffed.w
    _, ends_at, _, settles_at = w.epoch_times(s.run, 0)
    # No work yet: work done now, in epoch 0, is claimable when it settles.
    assert read(s, db).next_claim_at == settles_at
    w.travel_to(ends_at + 10)  # epoch 1 runs, the node worked in neither
    assert read(s, db).next_claim_at == w.epoch_times(s.run, 1)[3]
    hops = w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(1))
    keep_worked(db, w, [h for h in hops if h.receipt.worker == s.a.address])
    assert read(s, db).next_claim_at == settles_at  # its epoch-0 work settles first
    # By the run's settings: the epoch's end, an epoch to submit certificates, the window.
    assert settles_at == ends_at + EPOCH_S + WINDOW_S


def test_work_no_certificate_covers_after_submissions_close_is_missed(
    staffed: Staffed, db: Database
) -> None:
    s, w = staffed, staffed.w
    hops = w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(2))
    units = keep_worked(db, w, [h for h in hops if h.receipt.worker == s.a.address])
    w.to_submission(s.run, 0)
    waiting = epoch_zero(s, db)  # the data node may still submit
    assert waiting.phase == "certifying" and waiting.missed is None
    assert waiting.units_missed == 0

    _, _, closes_at, _ = w.epoch_times(s.run, 0)
    w.travel_to(closes_at + 1)
    missed = epoch_zero(s, db)
    assert missed.phase == "missed" and missed.units_worked == missed.units_missed == units > 0
    assert missed.missed == (
        f"no certificate from data node {s.data.address} before submissions closed"
    )
    assert missed.expected is not None and missed.expected.wei == "0"
    assert missed.pending.wei == missed.claimable.wei == "0"


def test_work_a_certificate_covers_is_not_missed(staffed: Staffed, db: Database) -> None:
    s, w = staffed, staffed.w
    hops = w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(2))
    keep_worked(db, w, [h for h in hops if h.receipt.worker == s.a.address])
    w.certify(w.certificate_tree(hops), s.run, 0, s.data)
    _, _, closes_at, _ = w.epoch_times(s.run, 0)
    w.travel_to(closes_at + 1)
    covered = epoch_zero(s, db)
    assert covered.phase == "disputable" and covered.missed is None
    assert covered.expected is not None and int(covered.pending.wei) > 0


def test_the_node_view_is_what_the_registry_says_of_it(staffed: Staffed, db: Database) -> None:
    """What ``gwtf-node status`` shows of a running node without a chain client of its own."""
    s, w = staffed, staffed.w
    node = read(s, db).node
    assert node is not None
    assert node.node == s.a.address and node.wallet == w.wallet(0)
    assert (node.status, int(node.stake.wei), node.unlock_at) == ("active", 2 * 10**18, None)
    assert int(node.wallet_balance.wei) == w.w3.eth.get_balance(w.wallet(0))


def test_an_epoch_closed_by_another_workers_claim_is_seen_closed_within_a_minute(
    staffed: Staffed, db: Database
) -> None:
    s, w = staffed, staffed.w
    hops = w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(2))
    keep_worked(db, w, [h for h in hops if h.receipt.worker == s.a.address])
    tree = w.certificate_tree(hops)
    cert = w.certify(tree, s.run, 0, s.data)
    w.to_settled(s.run, 0)
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)
    reader = ChainReader(
        contracts, EpochLedger(contracts, s.run, None), NodeRecords(db), s.a.address
    )
    w.claim(cert, tree, s.a, w.wallet(0))
    assert not reader.read().view.books[0].closed  # b has not claimed yet
    w.claim(cert, tree, s.b, w.wallet(1))  # the last claim closes the epoch
    assert not reader.read().view.books[0].closed  # kept a while: this node was not paid again
    w.travel_to(w.now() + OPEN_BOOK_READ_S + 1)
    assert reader.read().view.books[0].closed


def test_a_reading_with_no_new_block_asks_only_for_the_block_and_new_epochs(
    staffed: Staffed, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain says nothing new without a new block: a node polling every second asks for the
    latest block, and reads again only what its records name for the first time (an epoch it
    worked in since); what a new block brings is read at the next reading."""
    s, w = staffed, staffed.w
    hops = w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], range(2))
    mine = [h for h in hops if h.receipt.worker == s.a.address]
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)
    reader = ChainReader(
        contracts, EpochLedger(contracts, s.run, None), NodeRecords(db), s.a.address
    )
    first = reader.read()
    asked: list[str] = []
    request = w.w3.manager.request_blocking

    def counted(method: str, params: object, *args: object, **kwargs: object) -> object:
        asked.append(method)
        return request(method, params, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(w.w3.manager, "request_blocking", counted)
    again = reader.read()
    assert asked == ["eth_getBlockByNumber"]
    assert (again.view, again.runs, again.node, again.slashes) == (
        first.view, first.runs, first.node, first.slashes,
    )  # fmt: skip
    keep_worked(db, w, mine)
    asked.clear()
    worked = reader.read()
    # The block, then epoch 0's window and book (this eth-tester provider, unlike a node's
    # connection, also asks for the chain id and accounts each call).
    assert asked[0] == "eth_getBlockByNumber" and asked.count("eth_call") <= 2
    assert "eth_getLogs" not in asked
    assert list(worked.view.books) == [0]
    tree = w.certificate_tree(hops)
    w.certify(tree, s.run, 0, s.data)  # a new block
    w.to_settled(s.run, 0)
    assert reader.read().view.now > worked.view.now

"""The node's epoch cycle (``gwtf/node/receipts/epochs.py``) against the real contracts: a data node
certifies exactly the chained hops of bonded members and submits once, crashes included; a
worker's claim mined before a crash is recorded, never sent twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from eth_utils.crypto import keccak

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    HopReceipt,
    hop_key,
    receipt_digest,
    scheduled_units,
)
from gwtf.errors import GwtfError, ProtocolError
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.epochs import DataNodeEpochs, EpochClock, WorkerEpochs
from gwtf.node.receipts.proofs import checked_proofs
from gwtf.node.store.batches import RECEIVER, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore
from gwtf.node.store.ledger import LedgerRecords
from gwtf.node.store.models import HopProof
from tests.contracts.conftest import Staffed
from tests.contracts.crash_child import data_node_cycle
from tests.contracts.world import STAGES, TEST_GAS_LIMIT, UNITS_PER_HOP, NodeKey, World
from tests.node.sealed_receipts import keep_sealed


class CountingLedger(EpochLedger):
    """The real ledger, counting submissions; ``crash_after_submit`` dies right after one is
    mined, before the node records it (as a SIGKILL there would)."""

    submits = 0
    crash_after_submit = False

    def submit(self, cert: Any, spans: Any) -> bytes:
        tx_hash = super().submit(cert, spans)
        type(self).submits += 1
        if self.crash_after_submit:
            raise SystemExit("killed after the submission was mined")
        return tx_hash


def suite_of(w: World) -> Contracts:
    return Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)


def chained_hops(s: Staffed, ghost: NodeKey) -> tuple[list[SignedReceipt], list[dict[str, Any]]]:
    """Four microbatches through a (stage 1) and b (stage 2), every digest chained to the data
    node's sends; plus a forward a sent to ``ghost`` (no member of the run) and ghost's own."""
    w = s.w
    entries: list[SignedReceipt] = []
    anchors: list[dict[str, Any]] = []

    def hop(worker: NodeKey, to: NodeKey, m: int, stage: int, d: int, i: str, o: str) -> None:
        receipt = HopReceipt(
            s.run, 0, s.data.address, 0, m, stage, d, 0, worker.address, to.address,
            keccak(text=i), keccak(text=o), scheduled_units(d, UNITS_PER_HOP),
        )  # fmt: skip
        entries.append(w.signed(receipt, worker, to))

    for m in range(4):
        for direction, digest in ((FORWARD, f"embed {m}"), (BACKWARD, f"grad {m}")):
            anchors.append(
                {"run_id": s.run, "epoch": 0, "iteration": 0, "microbatch_id": m,
                 "direction": direction, "digest": keccak(text=digest)}
            )  # fmt: skip
        hop(s.a, s.b, m, 1, FORWARD, f"embed {m}", f"a1 {m}")
        hop(s.b, s.data, m, 2, FORWARD, f"a1 {m}", f"a2 {m}")
        hop(s.b, s.a, m, 2, BACKWARD, f"grad {m}", f"g2 {m}")
        hop(s.a, s.data, m, 1, BACKWARD, f"g2 {m}", f"g1 {m}")
    hop(s.a, ghost, 0, 1, FORWARD, "embed 0", "a1 0")  # chained, but to no member
    hop(ghost, s.data, 0, 2, FORWARD, "a1 0", "ghost out")
    return entries, anchors


def data_cycle(s: Staffed, db_path: Path, ledger: EpochLedger) -> DataNodeEpochs:
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    return data_node_cycle(terms, s.data.address, db_path, ledger)


def test_a_data_node_certifies_the_chained_hops_of_members_and_submits_once(
    staffed: Staffed, tmp_path: Path
) -> None:
    s, w = staffed, staffed.w
    ghost = w.register("ghost", w.stranger)  # bonded, but never joined the run
    entries, anchors = chained_hops(s, ghost)
    sponsor = Sender.unlocked(w.sponsor)
    CountingLedger.submits = 0
    crashing = CountingLedger(suite_of(w), s.run, sponsor)
    crashing.crash_after_submit = True
    cycle = data_cycle(s, tmp_path / "data.sqlite", crashing)
    # The hops the data node received are in its own database, half of them reported too.
    own = [e for e in entries if e.receipt.counterparty == s.data.address]
    reported = [e for e in entries if e not in own[: len(own) // 2]]
    cycle.store.add_reported([PreparedHop.of(e, w.ledger_domain) for e in reported])
    keep_sealed(BatchStore(cycle.store.db, w.ledger_domain), own, RECEIVER)
    cycle.store.add_anchors(anchors)
    w.to_submission(s.run, 0)

    with pytest.raises(SystemExit):
        cycle.settle(0)  # mined, then the node dies before it records the submission
    assert CountingLedger.submits == 1
    record = cycle.records.certificate(s.run, 0, s.data.address)
    assert record is not None and record.status == "pending"

    # Restarted on the same database: the chain says it is submitted; nothing is sent again.
    restarted = data_cycle(s, tmp_path / "data.sqlite", CountingLedger(suite_of(w), s.run, sponsor))
    restarted.settle(0)
    assert CountingLedger.submits == 1
    record = restarted.records.certificate(s.run, 0, s.data.address)
    assert record is not None and record.status == "confirmed"
    tree = restarted.inbox.trees[0]
    cert = restarted.ledger.certificate(0, s.data.address)
    assert cert is not None and (cert.root, cert.count, cert.units) == (
        tree.root,
        tree.count,
        tree.units,
    )
    # The 16 hops of the members, and none of the ghost's (nor a's forward to it).
    assert tree.count == 16
    assert set(tree.workers()) == {s.a.address, s.b.address}
    assert tree.units == 4 * 2 * (UNITS_PER_HOP + 2 * UNITS_PER_HOP)

    # Every worker's range claims on chain, and the epoch's budget is paid out to the wei.
    w.to_settled(s.run, 0)
    paid = 0
    for worker, wallet in ((s.a, w.wallet(0)), (s.b, w.wallet(1))):
        span = tree.worker_range(worker.address)
        assert span is not None
        paid += (
            EpochLedger(suite_of(w), s.run, Sender.unlocked(wallet)).claim(cert, span).amount_wei
        )
    budget, *_ = w.ledger.functions.epochBook(s.run, 0).call()
    assert paid == budget


class LateLedger(EpochLedger):
    """The real ledger, whose first look for a mined claim misses it: as when a send timed out
    and its transaction was mined after the look."""

    looked = False

    def paid(self, epoch: int, data_node: str, node: str) -> Any:
        if not self.looked:
            self.looked = True
            return None
        return super().paid(epoch, data_node, node)


@pytest.mark.parametrize(
    ("late", "proofs_served"),
    [(False, True), (True, True), (True, False)],
    ids=["seen-before-sending", "refused-then-seen", "proofs-not-served"],
)
def test_a_claim_mined_before_a_crash_is_recorded_and_never_paid_twice(
    staffed: Staffed, tmp_path: Path, late: bool, proofs_served: bool
) -> None:
    s, w = staffed, staffed.w
    entries, anchors = chained_hops(s, w.register("ghost", w.stranger))
    sponsor = Sender.unlocked(w.sponsor)
    cycle = data_cycle(s, tmp_path / "data.sqlite", EpochLedger(suite_of(w), s.run, sponsor))
    cycle.store.add_reported([PreparedHop.of(e, w.ledger_domain) for e in entries])
    cycle.store.add_anchors(anchors)
    w.to_submission(s.run, 0)
    cycle.settle(0)
    cert = cycle.ledger.certificate(0, s.data.address)
    span = cycle.inbox.trees[0].worker_range(s.a.address)
    assert cert is not None and span is not None
    w.to_settled(s.run, 0)
    wallet = (LateLedger if late else EpochLedger)(suite_of(w), s.run, Sender.unlocked(w.wallet(0)))
    mined = wallet.claim(cert, span)  # ... and the node died before recording it

    db = open_database(f"sqlite:///{tmp_path / 'a.sqlite'}")
    clock = EpochClock(wallet, read=w.now())

    def no_peer(address: str) -> str | None:
        raise AssertionError("a claim already on chain needs no range from the data node")

    unused: Any = None
    worker = WorkerEpochs(
        cycle.terms, s.a.address, wallet, clock, HopStore(db), LedgerRecords(db), unused,
        no_peer, 1.0,
    )  # fmt: skip
    if late:  # it missed the claim, so it asks for its range and sends it again: refused

        async def fetch_range(epoch: int, data_node: str) -> Any:
            return span

        async def fetch_proofs(epoch: int, data_node: str, root: bytes, span: Any) -> Any:
            if not proofs_served:  # the data node will not: it costs the proofs, not the claim
                raise ProtocolError("the data node served 0 of this node's leaves")
            leaves = range(span.first.hop.index, span.last.hop.index + 1)
            return checked_proofs([tree.leaf_proof(i) for i in leaves], span, root)

        tree = cycle.inbox.trees[0]
        worker.fetch_range = fetch_range  # type: ignore[method-assign]
        worker.fetch_proofs = fetch_proofs  # type: ignore[method-assign]

    async def claim_and_keep_proofs() -> None:
        await worker._try_claim(0, s.data.address)
        await worker.keep_proofs()

    trio.run(claim_and_keep_proofs)
    record = worker.records.claim(s.run, 0, s.data.address, s.a.address)
    assert record is not None and (record.status, record.error) == ("confirmed", None)
    assert record.amount_wei == str(mined.amount_wei) and record.tx_hash == mined.tx_hash
    assert (0, s.data.address) in worker.done
    assert len(w.ledger.events.RewardClaimed.get_logs(from_block=0)) == 1
    with db.sessions() as session:  # the proofs of its leaves kept when it built the claim
        kept = session.query(HopProof).count()
    assert kept == (span.last.hop.index - span.first.hop.index + 1 if late and proofs_served else 0)


def test_a_certificate_on_chain_that_is_not_this_nodes_is_an_error(
    staffed: Staffed, tmp_path: Path
) -> None:
    s, w = staffed, staffed.w
    entries, anchors = chained_hops(s, w.register("ghost", w.stranger))
    cycle = data_cycle(
        s, tmp_path / "data.sqlite", EpochLedger(suite_of(w), s.run, Sender.unlocked(w.sponsor))
    )
    cycle.store.add_reported([PreparedHop.of(e, w.ledger_domain) for e in entries])
    cycle.store.add_anchors(anchors)
    w.to_submission(s.run, 0)
    cycle.settle(0)
    other = data_cycle(
        s, tmp_path / "other.sqlite", EpochLedger(suite_of(w), s.run, Sender.unlocked(w.sponsor))
    )
    # A database whose certified hops are not those of the certificate on chain (another
    # node's, or a lost one): the node refuses to serve ranges of a tree it cannot rebuild.
    first = entries[0]
    digest = receipt_digest(first.receipt, w.ledger_domain)
    other.store.replace_certified(s.run, 0, [(hop_key(first.receipt), digest, first)])
    with pytest.raises(GwtfError, match="not this node's"):
        other.settle(0)

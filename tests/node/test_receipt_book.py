"""Receipts on the hot path (``gwtf/node/receipts/book.py``, ``recording.py``): what both ends
record is the contract mirror's receipt; a batch the receiver countersigns completes it at both
ends; a held receipt joins no batch until released; no node records two versions of a hop; a
receiver that withholds is stopped for the iteration and scored; the wire format of reports and
ranges holds."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trio
from eth_utils.crypto import keccak
from hypothesis import given
from hypothesis import strategies as st

from gwtf.contracts.certificate_tree import SignedReceipt, build_certificate_tree, check_signatures
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    HOP_RECEIPT_FIELDS,
    ledger_domain,
    snake_case,
)
from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.receipts.batching import BatchSettings
from gwtf.node.receipts.book import (
    HopFacts,
    ReceiptTerms,
    address_of_peer,
    check_mirrors_receipt,
)
from gwtf.node.receipts.recording import ReceiptBook
from gwtf.node.receipts.reports import MAX_DATA_NODES, ReceiptReporter
from gwtf.node.receipts.wire import decode_range, decode_receipts, encode_range, encode_receipts
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore

DOMAIN = ledger_domain(31337, "0x" + "ef" * 20)
TERMS = ReceiptTerms(run_id=1, domain=DOMAIN, stages=2, units_per_hop=10)
KEYS = {name: keccak(text=f"receipt book test {name}") for name in ("data", "a", "b", "x")}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}


def book(
    tmp_path: Path,
    name: str,
    penalties: list[tuple[str, str]],
    settings: BatchSettings | None = None,
) -> ReceiptBook:
    db = open_database(f"sqlite:///{tmp_path / name}.sqlite")
    return ReceiptBook(
        TERMS, KEYS[name], BatchStore(db, DOMAIN),
        penalise=lambda peer, why: penalties.append((peer, why)),
        settings=settings or BatchSettings(),
    )  # fmt: skip


def facts(attempt: int = 0, output: bytes = b"out") -> HopFacts:
    return HopFacts(
        epoch=0, data_node=PEER["data"], iteration=0, microbatch_id=7, stage=1,
        direction=FORWARD, attempt=attempt, worker=PEER["a"], counterparty=PEER["b"],
        input_digest=keccak(b"in"), output_digest=keccak(output),
    )  # fmt: skip


class Loop:
    """Request-response between books in one process: a request reaches the handler its
    receiver serves, as from the sender's peer id."""

    def __init__(self, handlers: dict[str, Any], me: str) -> None:
        self.handlers, self.me = handlers, me

    def serve(self, protocol: str, handler: Any, *_: Any) -> None:
        self.handlers[(str(self.me), protocol)] = handler

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        return await self.handlers[(str(peer), protocol)](self.me, payload)  # type: ignore[no-any-return]


def run_with(books: dict[str, ReceiptBook], body: object) -> None:
    handlers: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for name, b in books.items():
                nursery.start_soon(b.run, Loop(handlers, PEER[name]))
            await trio.sleep(0)
            await body()  # type: ignore[operator]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_hops_facts_are_its_receipts_fields_but_the_runs_under_peer_ids() -> None:
    """What the data plane knows of a hop is the receipt less what the run's terms give (its
    run and units), its three nodes as peer ids: a field added to the receipt shows here."""
    from_terms = {"runId", "units"}
    expected = [snake_case(n) for n, _ in HOP_RECEIPT_FIELDS if n not in from_terms]
    assert list(HopFacts._fields) == expected
    receipt = facts().receipt(TERMS)
    for name, _ in HOP_RECEIPT_FIELDS:
        if name in ("dataNode", "worker", "counterparty"):
            peer = getattr(facts(), snake_case(name))
            assert getattr(receipt, name) == address_of_peer(peer), name
        elif name not in from_terms:
            assert getattr(receipt, name) == getattr(facts(), snake_case(name)), name
    assert (receipt.runId, receipt.units) == (TERMS.run_id, TERMS.units_per_hop)


def test_a_hop_record_that_drifts_from_the_receipt_is_refused() -> None:
    @dataclass(frozen=True)
    class Missing:  # no output digest
        epoch: int
        data_node: str
        iteration: int
        microbatch_id: int
        stage: int
        direction: int
        attempt: int
        worker: str
        counterparty: str
        input_digest: bytes

    @dataclass(frozen=True)
    class Mistyped(Missing):
        output_digest: str  # a digest is bytes

    for drifted in (Missing, Mistyped):
        with pytest.raises(TypeError, match="HopReceipt's fields less runId, units"):
            check_mirrors_receipt(drifted)
    check_mirrors_receipt(HopFacts)


def test_both_ends_record_the_hop_and_a_batch_completes_it_at_both(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    completed, received = [], []
    worker.on_complete = lambda origin, entry: completed.append((origin, entry))
    receiver.on_received = lambda origin, entry: received.append((origin, entry))

    async def body() -> None:
        receipt = worker.receipt(facts())
        assert receipt.worker == address_of_peer(PEER["a"]) == worker.address
        assert receipt.counterparty == receiver.address
        assert receipt.dataNode == address_of_peer(PEER["data"])
        assert receipt.units == 10 and receipt.stage == 1
        # The receiver rebuilds the same receipt from what it received; each end records it.
        assert receiver.receipt(facts()) == receipt
        assert await worker.record(receipt, PEER["b"], PEER["data"])
        assert await receiver.record(receipt, PEER["a"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 1
        with trio.fail_after(5):
            while not received:
                await trio.sleep(0.01)

    run_with({"a": worker, "b": receiver}, body)
    assert penalties == []
    ((origin, entry),) = completed
    assert origin == PEER["data"] and received == completed, "both ends report it"
    check_signatures(entry, DOMAIN)  # what the disputes contract checks of a hop
    assert worker.store.sealed(1, 0, WORKER) == [entry]
    assert receiver.store.sealed(1, 0, RECEIVER) == [entry]
    assert build_certificate_tree([entry], DOMAIN).count == 1
    assert (worker.counts.signed, receiver.counts.countersigned) == (1, 1)


def test_a_held_receipt_joins_no_batch_until_released(tmp_path: Path) -> None:
    """A backward recorded held (its forward's batch not countersigned yet) stays out of
    every batch, and closes once released."""
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    completed: list[SignedReceipt] = []
    worker.on_complete = lambda origin, entry: completed.append(entry)

    async def body() -> None:
        receipt = worker.receipt(facts())
        assert await worker.record(receipt, PEER["b"], PEER["data"], held=True)
        assert await receiver.record(receipt, PEER["a"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 0
        worker.release(receipt)
        assert await worker.close_due(iteration_end=True) == 1

    run_with({"a": worker, "b": receiver}, body)
    assert [e.receipt for e in completed] == [worker.receipt(facts())] and penalties == []


def test_a_backward_released_by_its_forwards_batch_closes_in_the_same_iteration_end(
    tmp_path: Path,
) -> None:
    """At an iteration's end a forward's batch is countersigned first; the backward it releases
    (in the background) closes in the second round of that same close, not a max age later
    (or never, after a run's last iteration)."""
    penalties: list[tuple[str, str]] = []
    worker = book(tmp_path, "a", penalties)
    downstream, upstream = book(tmp_path, "b", penalties), book(tmp_path, "x", penalties)
    forward = worker.receipt(facts())
    backward_facts = facts()._replace(direction=BACKWARD, counterparty=PEER["x"])
    backward = worker.receipt(backward_facts)

    def release_backward(receipts: tuple[Any, ...], whole: bool) -> None:
        if whole:  # the forward's batch countersigned: the backward may close
            worker.release(backward)

    worker.on_sealed = release_backward

    async def body() -> None:
        assert await worker.record(forward, PEER["b"], PEER["data"])
        assert await downstream.record(forward, PEER["a"], PEER["data"])
        assert await worker.record(backward, PEER["x"], PEER["data"], held=True)
        assert await upstream.record(backward, PEER["a"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 2

    run_with({"a": worker, "b": downstream, "x": upstream}, body)
    assert penalties == []


def test_no_node_records_two_versions_of_one_hop(tmp_path: Path) -> None:
    """A second receipt under a hop key held is not recorded: the worker learns it (and
    re-sends under the next attempt), a receiver refuses and scores the sender."""
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)

    async def body() -> None:
        first = worker.receipt(facts())
        second = worker.receipt(facts(output=b"another output"))  # same hop key
        assert await worker.record(first, PEER["b"], PEER["data"])
        conflicts: list[bool] = []
        assert not await worker.record(second, PEER["b"], PEER["data"], conflicts)
        assert conflicts == [True]
        assert await worker.record(first, PEER["b"], PEER["data"]), "the same again is held"
        assert await receiver.record(first, PEER["a"], PEER["data"])
        assert not await receiver.record(second, PEER["a"], PEER["data"])

    run_with({"a": worker, "b": receiver}, body)
    assert [peer for peer, _ in penalties] == [PEER["a"]]
    assert receiver.counts.refused == 1 and worker.counts.refused == 0


def test_a_receiver_that_withholds_is_stopped_scored_and_nothing_is_sealed(
    tmp_path: Path,
) -> None:
    """The receiver never records the hop the worker batches: it answers "not yet" (the close
    may have overtaken the hop), which stops nobody at first; still so ``max_age_s`` later, it
    is withholding: the worker scores it and sends it no hop for the iteration, until the
    next. Nothing is sealed, and the batch is not settled while its close is sent again."""
    penalties: list[tuple[str, str]] = []
    settings = BatchSettings(max_age_s=0.2)
    worker = book(tmp_path, "a", penalties, settings)
    receiver = book(tmp_path, "b", penalties, settings)
    completed: list[SignedReceipt] = []
    settled: list[bool] = []
    worker.on_complete = lambda origin, entry: completed.append(entry)
    worker.on_sealed = lambda receipts, whole: settled.append(whole)

    async def body() -> None:
        worker.iteration_started(0)
        assert await worker.record(worker.receipt(facts()), PEER["b"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 0
        assert worker.withholders.may_send(PEER["b"]), "'not yet' is nobody's fault at first"
        assert len(worker.batches.pending_requests()) == 1
        with trio.fail_after(5):
            while worker.withholders.may_send(PEER["b"]):  # sent again on the timer
                await trio.sleep(0.05)
        worker.iteration_started(1)
        assert worker.withholders.may_send(PEER["b"])

    run_with({"a": worker, "b": receiver}, body)
    assert completed == [] and settled == [], "still to be sent again: not settled"
    assert PEER["b"] in [peer for peer, _ in penalties]
    assert worker.store.sealed(1, 0, WORKER) == [], "nothing countersigned, nothing sealed"


def test_a_close_that_overtook_its_hop_is_sent_again_and_completes(tmp_path: Path) -> None:
    """The worker closes before the receiver has recorded the hop: "not yet", the batch is
    kept and not settled (a forward's backwards still wait for it); once the receiver has
    the hop, the next close sends it again and it is countersigned and reported at both ends."""
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    completed: list[SignedReceipt] = []
    settled: list[bool] = []
    worker.on_complete = lambda origin, entry: completed.append(entry)
    worker.on_sealed = lambda receipts, whole: settled.append(whole)

    async def body() -> None:
        receipt = worker.receipt(facts())
        assert await worker.record(receipt, PEER["b"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 0
        assert settled == [] and worker.withholders.may_send(PEER["b"])
        assert await receiver.record(receipt, PEER["a"], PEER["data"])
        assert await worker.close_due() == 1, "the same close, sent again"
        assert settled == [True] and worker.batches.pending_requests() == []

    run_with({"a": worker, "b": receiver}, body)
    assert [e.receipt for e in completed] == [worker.receipt(facts())] and penalties == []


def test_a_received_hop_naming_another_worker_than_its_sender_is_refused(
    tmp_path: Path,
) -> None:
    """A receiver records a hop only under the authenticated peer it came from as worker: one
    naming another (a third party planting a receipt under a's hop key) is refused and its
    sender charged; a's own hop under that key is then recorded and closes."""
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)

    async def body() -> None:
        receipt = worker.receipt(facts())
        planted = worker.receipt(facts(output=b"planted"))  # a's hop key, another receipt
        assert not await receiver.record(planted, PEER["x"], PEER["data"])
        assert await worker.record(receipt, PEER["b"], PEER["data"])
        assert await receiver.record(receipt, PEER["a"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 1

    run_with({"a": worker, "b": receiver}, body)
    assert [peer for peer, _ in penalties] == [PEER["x"]]
    assert "another worker" in penalties[0][1]


def test_reports_and_ranges_round_trip(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    entries = []
    worker.on_complete = lambda origin, entry: entries.append(entry)

    async def body() -> None:
        for attempt in range(3):
            receipt = worker.receipt(facts(attempt))
            assert await worker.record(receipt, PEER["b"], PEER["data"])
            assert await receiver.record(receipt, PEER["a"], PEER["data"])
        assert await worker.close_due(iteration_end=True) == 1

    run_with({"a": worker, "b": receiver}, body)
    assert len(entries) == 3 and all(e.proof for e in entries), "one batch of three"
    assert decode_receipts(encode_receipts(entries)) == entries
    tree = build_certificate_tree(entries, DOMAIN)
    span = tree.worker_range(worker.address)
    assert span is not None and decode_range(encode_range(span)) == span
    assert decode_range(encode_range(None)) is None
    # A receipt of a larger batch travels and is kept with its proof in the batch.
    batched = replace(entries[0], proof=(b"\x01" * 32, b"\x03" * 32))
    assert decode_receipts(encode_receipts([batched])) == [batched]
    hops = HopStore(worker.store.db)
    hops.certify([(batched.receipt.hop_key, b"\x02" * 32, batched)])
    assert hops.certified_hops(1, 0) == [batched]


@given(st.binary(max_size=800))
def test_bad_report_and_range_bytes_raise_only_a_protocol_error(data: bytes) -> None:
    for decode in (decode_receipts, decode_range):
        with contextlib.suppress(ProtocolError):  # anything else fails the test
            decode(data)


def test_a_relays_outbox_keeps_few_data_nodes_a_peer_names_but_every_known_one(
    tmp_path: Path,
) -> None:
    penalties: list[tuple[str, str]] = []
    worker = book(tmp_path, "a", penalties)
    unused: Any = None
    receipt = worker.receipt(facts())
    known = receipt.dataNode
    reporter = ReceiptReporter(unused, 1.0, data_node_peers=lambda: {known: PEER["data"]})
    # Receipts naming ever new origins (a hop's origin is its sender's word): few outboxes.
    for n in range(3 * MAX_DATA_NODES):
        named = replace(receipt, dataNode="0x" + f"{n + 1:040x}")
        reporter.add(PEER["x"], SignedReceipt(named, b"", b""))
    assert len(reporter.outbox) == MAX_DATA_NODES
    reporter.add(PEER["data"], SignedReceipt(receipt, b"", b""))
    assert known in reporter.outbox, "a data node discovery knows always has its outbox"

"""Receipts on the hot path (``gwtf/node/receipts/book.py``): what the worker signs and the receiver
countersigns is the contract mirror's receipt, each committed before it is handed out, and the
receiver holds it whole before its ack; a bad signature either way is refused, scored and
logged once; no node signs two versions of a hop; the wire format of reports and ranges
holds."""

from __future__ import annotations

import contextlib
import logging
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
    FORWARD,
    HOP_RECEIPT_FIELDS,
    HopReceipt,
    ledger_domain,
    receipt_digest,
    recover_digest_signer,
    recover_signer,
    sign_receipt,
    snake_case,
)
from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.receipts import reports
from gwtf.node.receipts.book import (
    HopFacts,
    ReceiptBook,
    ReceiptTerms,
    address_of_peer,
    check_mirrors_receipt,
)
from gwtf.node.receipts.certify import check_report
from gwtf.node.receipts.reports import MAX_DATA_NODES, ReceiptInbox, ReceiptReporter
from gwtf.node.receipts.wire import decode_range, decode_receipts, encode_range, encode_receipts
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore

DOMAIN = ledger_domain(31337, "0x" + "ef" * 20)
TERMS = ReceiptTerms(run_id=1, domain=DOMAIN, stages=2, units_per_hop=10)
KEYS = {name: keccak(text=f"receipt book test {name}") for name in ("data", "a", "b", "x")}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}


def book(tmp_path: Path, name: str, penalties: list[tuple[str, str]]) -> ReceiptBook:
    db = open_database(f"sqlite:///{tmp_path / name}.sqlite")
    return ReceiptBook(
        TERMS, KEYS[name], HopStore(db), penalise=lambda peer, why: penalties.append((peer, why))
    )


def facts(attempt: int = 0, output: bytes = b"out") -> HopFacts:
    return HopFacts(
        epoch=0, data_node=PEER["data"], iteration=0, microbatch_id=7, stage=1,
        direction=FORWARD, attempt=attempt, worker=PEER["a"], counterparty=PEER["b"],
        input_digest=keccak(b"in"), output_digest=keccak(output),
    )  # fmt: skip


def run_with(books: list[ReceiptBook], body: object) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for b in books:
                nursery.start_soon(b.run)
            await body()  # type: ignore[operator]
            nursery.cancel_scope.cancel()

    trio.run(main)


async def completion(book: ReceiptBook, count: int) -> None:
    """Until ``book`` has signed and handed on ``count`` receipts (its writer thread's)."""
    with trio.fail_after(10):
        while book.counts.completed < count:
            await trio.sleep(0.01)


async def exchange(
    worker: ReceiptBook, receiver: ReceiptBook, receipt: HopReceipt
) -> tuple[bytes, bytes, bool]:
    """One receipted hop from ``a`` to ``b``: the worker signs, the receiver countersigns, the
    worker checks the ack. (signature, countersignature, whether the worker took it)"""
    signature = await worker.sign(receipt)
    assert signature is not None
    counter = await receiver.countersign(PEER["a"], PEER["data"], receipt, signature)
    return (
        signature,
        counter,
        worker.acknowledged(PEER["b"], PEER["data"], receipt, signature, counter),
    )


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


def test_the_worker_signs_the_receiver_countersigns_and_both_keep_the_receipt(
    tmp_path: Path,
) -> None:
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
        # The receiver rebuilds the same receipt from what it received, checks the worker's
        # signature, and has the whole receipt on disk before its countersignature is out.
        assert receiver.receipt(facts()) == receipt
        signature = await worker.sign(receipt)
        assert (
            signature is not None and recover_signer(receipt, DOMAIN, signature) == worker.address
        )
        # It signs the receipt as a batch of one (its proof empty), never the bare digest.
        assert recover_digest_signer(receipt_digest(receipt, DOMAIN), signature) != worker.address
        counter = await receiver.countersign(PEER["a"], PEER["data"], receipt, signature)
        assert recover_signer(receipt, DOMAIN, counter) == receiver.address
        assert receiver.store.received_hops(1, 0) == [SignedReceipt(receipt, signature, counter)]
        assert worker.acknowledged(PEER["b"], PEER["data"], receipt, signature, counter)
        await completion(worker, 1)

    run_with([worker, receiver], body)
    assert penalties == []
    ((origin, entry),) = completed
    assert origin == PEER["data"] and received == completed, "both ends report it"
    check_signatures(entry, DOMAIN)  # what the disputes contract checks of a hop
    (kept,) = worker.store.signed_hops(1, 0)
    assert kept == entry, "the complete receipt is in the worker's database"
    assert build_certificate_tree([kept], DOMAIN).count == 1
    assert (worker.counts.signed, receiver.counts.countersigned) == (1, 1)


def test_a_bad_countersignature_is_refused_scored_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    caplog.set_level(logging.WARNING, logger="gwtf.node.receipts.book")

    async def body() -> None:
        receipt = worker.receipt(facts())
        signature = await worker.sign(receipt)
        assert signature is not None
        _, counter_of_other, _ = await exchange(worker, receiver, worker.receipt(facts(1)))
        # Not the receiver's key, then the receiver's signature of another receipt.
        assert not worker.acknowledged(PEER["b"], PEER["data"], receipt, signature, b"\x01" * 65)
        assert not worker.acknowledged(
            PEER["b"], PEER["data"], receipt, signature, counter_of_other
        )
        counter = await receiver.countersign(PEER["a"], PEER["data"], receipt, signature)
        assert worker.acknowledged(PEER["b"], PEER["data"], receipt, signature, counter)
        await completion(worker, 2)

    run_with([worker, receiver], body)
    assert [peer for peer, _ in penalties] == [PEER["b"], PEER["b"]]
    assert worker.counts.refused == 2 and worker.counts.completed == 2
    assert {e.receipt for e in worker.store.signed_hops(1, 0)} == {
        worker.receipt(facts()),
        worker.receipt(facts(1)),
    }
    logged = [r for r in caplog.records if PEER["b"] in r.getMessage()]
    assert len(logged) == 1, "a misbehaving peer is logged once"


def test_a_receipt_its_worker_did_not_sign_is_refused_and_nothing_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    penalties: list[tuple[str, str]] = []
    receiver = book(tmp_path, "b", penalties)
    caplog.set_level(logging.WARNING, logger="gwtf.node.receipts.book")
    results = []

    async def body() -> None:
        receipt = receiver.receipt(facts())
        # Signed by another key; then a's signature of a receipt for another output (the
        # frame that arrived is not the one a signed).
        by_x = sign_receipt(receipt, DOMAIN, KEYS["x"])
        other_output = sign_receipt(receiver.receipt(facts(output=b"else")), DOMAIN, KEYS["a"])
        for signature in (by_x, other_output, b"\x00" * 65):
            results.append(await receiver.countersign(PEER["a"], PEER["data"], receipt, signature))

    run_with([receiver], body)
    assert results == [b"", b"", b""]
    assert [peer for peer, _ in penalties] == [PEER["a"]] * 3
    assert receiver.store.received_hops(1, 0) == [] and receiver.counts.countersigned == 0
    assert len([r for r in caplog.records if PEER["a"] in r.getMessage()]) == 1


def test_no_node_signs_or_countersigns_two_versions_of_one_hop(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    results = []
    received = []
    receiver.on_received = lambda origin, entry: received.append(entry)

    async def body() -> None:
        first = worker.receipt(facts())
        second = worker.receipt(facts(output=b"another output"))  # same hop key
        signature, counter, taken = await exchange(worker, receiver, first)
        assert taken and counter != b""
        # The worker never signs a second version, whatever it computed ...
        assert await worker.sign(second) is None
        assert await worker.sign(first) == signature, "the first again is the same signature"
        # The same hop asked again gets the same countersignature, and is not reported twice.
        again = await receiver.countersign(PEER["a"], PEER["data"], first, signature)
        assert again == counter and len(received) == 1
        # ... nor does the receiver countersign one, though its worker signed it.
        dishonest = sign_receipt(second, DOMAIN, KEYS["a"])
        results.append(await receiver.countersign(PEER["a"], PEER["data"], second, dishonest))
        await completion(worker, 1)

    run_with([worker, receiver], body)
    assert results == [b""]
    assert penalties and penalties[-1][0] == PEER["a"]
    assert [e.receipt for e in worker.store.signed_hops(1, 0)] == [worker.receipt(facts())]
    assert [e.receipt for e in receiver.store.received_hops(1, 0)] == [worker.receipt(facts())]


def test_reports_and_ranges_round_trip(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    entries = []
    worker.on_complete = lambda origin, entry: entries.append(entry)

    async def body() -> None:
        for attempt in range(3):
            await exchange(worker, receiver, worker.receipt(facts(attempt)))
        await completion(worker, 3)

    run_with([worker, receiver], body)
    assert decode_receipts(encode_receipts(entries)) == entries
    tree = build_certificate_tree(entries, DOMAIN)
    span = tree.worker_range(worker.address)
    assert span is not None and decode_range(encode_range(span)) == span
    assert decode_range(encode_range(None)) is None
    # A receipt of a larger batch travels and is kept with its proof in the batch.
    batched = replace(entries[0], proof=(b"\x01" * 32, b"\x03" * 32))
    assert decode_receipts(encode_receipts([batched])) == [batched]
    worker.store.certify([(batched.receipt.hop_key, b"\x02" * 32, batched)])
    assert worker.store.certified_hops(1, 0) == [batched]


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


def test_a_data_node_takes_a_receipt_it_countersigned_itself_without_checking_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receipt of a hop into the data node is whole in its own database once it acked
    the hop; when the hop's worker reports it too, the data node takes it as held, without
    recovering its two signatures again. Other bytes under its hop key are checked."""
    penalties: list[tuple[str, str]] = []
    worker, data = book(tmp_path, "a", penalties), book(tmp_path, "data", penalties)
    inbox = ReceiptInbox(None, TERMS, data.address, data.store, 1.0)  # type: ignore[arg-type]
    checked: list[SignedReceipt] = []

    def counting(entry: SignedReceipt, *args: Any) -> Any:
        checked.append(entry)
        return check_report(entry, *args)

    monkeypatch.setattr(reports, "check_report", counting)
    into_data = facts()._replace(stage=2, counterparty=PEER["data"])
    entries: list[SignedReceipt] = []

    async def body() -> None:
        receipt = worker.receipt(into_data)
        signature = await worker.sign(receipt)
        assert signature is not None
        counter = await data.countersign(PEER["a"], PEER["data"], receipt, signature)
        entries.append(SignedReceipt(receipt, signature, counter))
        assert await inbox._report(PEER["a"], encode_receipts(entries)) == b"\x00\x01\x00\x00"
        forged = replace(entries[0], counterparty_signature=signature)
        assert await inbox._report(PEER["a"], encode_receipts([forged])) == b"\x00\x00\x00\x01"

    run_with([worker, data], body)
    assert checked == [replace(entries[0], counterparty_signature=entries[0].worker_signature)]
    assert data.store.reported_hops(1, 0) == [], "its own copy is the one certified"
    assert (inbox.accepted, inbox.refused) == (1, 1) and penalties == []

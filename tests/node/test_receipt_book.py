"""Receipts on the hot path (``node/receipts/book.py``): what the receiver countersigns and the
worker signs is the contract mirror's receipt, each committed before it is handed out; a bad
countersignature is refused, scored and logged once; no node signs two versions of a hop; the
wire format of reports and ranges holds."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest
import trio
from eth_utils.crypto import keccak
from hypothesis import given
from hypothesis import strategies as st

from contracts.certificate_tree import build_certificate_tree, check_signatures
from contracts.encoding import FORWARD, ledger_domain, recover_signer, sign_receipt
from gwtf.errors import ProtocolError
from node.p2p.identity import identity_from_key, peer_id_of
from node.receipts.book import HopFacts, ReceiptBook, ReceiptTerms, address_of_peer
from node.receipts.wire import decode_range, decode_receipts, encode_range, encode_receipts
from node.store.database import open_database
from node.store.hops import HopStore

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
        0, PEER["data"], 0, 7, 1, FORWARD, attempt, PEER["a"], PEER["b"], keccak(b"in"),
        keccak(output),
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


def test_the_receiver_countersigns_the_worker_signs_and_the_receipt_certifies(
    tmp_path: Path,
) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    completed = []
    worker.on_complete = lambda origin, entry: completed.append((origin, entry))

    async def body() -> None:
        receipt = worker.receipt(facts())
        assert receipt.worker == address_of_peer(PEER["a"]) == worker.address
        assert receipt.counterparty == receiver.address
        assert receipt.dataNode == address_of_peer(PEER["data"])
        assert receipt.units == 10 and receipt.stage == 1
        # The receiver rebuilds the same receipt from what it received, and countersigns it.
        assert receiver.receipt(facts()) == receipt
        counter = await receiver.countersign(PEER["a"], receipt)
        assert recover_signer(receipt, DOMAIN, counter) == receiver.address
        assert worker.acknowledged(PEER["b"], PEER["data"], receipt, counter)
        await completion(worker, 1)

    run_with([worker, receiver], body)
    assert penalties == []
    ((origin, entry),) = completed
    assert origin == PEER["data"]
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
    caplog.set_level(logging.WARNING, logger="node.receipts.book")

    async def body() -> None:
        receipt = worker.receipt(facts())
        other = worker.receipt(facts(1))
        counter_of_other = await receiver.countersign(PEER["a"], other)
        # Not the receiver's key, then the receiver's signature of another receipt.
        assert not worker.acknowledged(PEER["b"], PEER["data"], receipt, b"\x01" * 65)
        assert not worker.acknowledged(PEER["b"], PEER["data"], receipt, counter_of_other)
        counter = await receiver.countersign(PEER["a"], receipt)
        assert worker.acknowledged(PEER["b"], PEER["data"], receipt, counter)
        await completion(worker, 1)

    run_with([worker, receiver], body)
    assert [peer for peer, _ in penalties] == [PEER["b"], PEER["b"]]
    assert worker.counts.refused == 2 and worker.counts.signed == 1
    assert worker.store.signed_hops(1, 0)[0].receipt == worker.receipt(facts())
    logged = [r for r in caplog.records if PEER["b"] in r.getMessage()]
    assert len(logged) == 1, "a misbehaving peer is logged once"


def test_no_node_signs_or_countersigns_two_versions_of_one_hop(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    results = []
    completed = []
    worker.on_complete = lambda origin, entry: completed.append(entry)

    async def body() -> None:
        first = worker.receipt(facts())
        second = worker.receipt(facts(output=b"another output"))  # same hop key
        results.append(await receiver.countersign(PEER["a"], first))
        # The sender re-uses the hop key for other contents: refused, and counted against it.
        results.append(await receiver.countersign(PEER["a"], second))
        # Nor does the worker sign a second version, whatever it is told.
        forged = sign_receipt(second, DOMAIN, KEYS["b"])
        assert worker.acknowledged(PEER["b"], PEER["data"], first, results[0])
        assert worker.acknowledged(PEER["b"], PEER["data"], second, forged)
        await completion(worker, 1)
        await trio.sleep(0.2)  # the second one's batch is written, and refused

    run_with([worker, receiver], body)
    assert results[0] != b"" and results[1] == b""
    assert penalties and penalties[-1][0] == PEER["a"]
    assert [e.receipt for e in completed] == [worker.receipt(facts())]
    assert worker.counts.signed == 1


def test_reports_and_ranges_round_trip(tmp_path: Path) -> None:
    penalties: list[tuple[str, str]] = []
    worker, receiver = book(tmp_path, "a", penalties), book(tmp_path, "b", penalties)
    entries = []
    worker.on_complete = lambda origin, entry: entries.append(entry)

    async def body() -> None:
        for attempt in range(3):
            receipt = worker.receipt(facts(attempt))
            counter = await receiver.countersign(PEER["a"], receipt)
            worker.acknowledged(PEER["b"], PEER["data"], receipt, counter)
        await completion(worker, 3)

    run_with([worker, receiver], body)
    assert decode_receipts(encode_receipts(entries)) == entries
    tree = build_certificate_tree(entries, DOMAIN)
    span = tree.worker_range(worker.address)
    assert span is not None and decode_range(encode_range(span)) == span
    assert decode_range(encode_range(None)) is None


@given(st.binary(max_size=800))
def test_bad_report_and_range_bytes_raise_only_a_protocol_error(data: bytes) -> None:
    for decode in (decode_receipts, decode_range):
        with contextlib.suppress(ProtocolError):  # anything else fails the test
            decode(data)

"""A node's receipts served over ``/gwtf/receipts/3.0.0`` (real libp2p hosts on 127.0.0.1, a
real SQLite store): every complete receipt it signed or countersigned, and a data node's
certificate with each leaf's proof against its root, in bounded pages; the page formats hold
against arbitrary bytes."""

from __future__ import annotations

import contextlib
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from eth_utils.crypto import keccak
from hypothesis import given
from hypothesis import strategies as st

from gwtf.contracts.certificate_tree import (
    SignedReceipt,
    build_certificate_tree,
    check_signatures,
)
from gwtf.contracts.encoding import (
    FORWARD,
    HopReceipt,
    hop_key,
    ledger_domain,
    node_address_of,
    node_public_key,
    sign_receipt,
)
from gwtf.contracts.merkle import verify_proof
from gwtf.errors import ProtocolError
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import PublicRate, RequestResponse, RpcLimits
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.serving import (
    CERTIFIED,
    RECEIPTS_PROTOCOL,
    RECEIVED,
    SIGNED,
    Fetched,
    ReceiptServer,
    certified_page,
    fetch_receipts,
)
from gwtf.node.receipts.wire import (
    MAX_PAGE,
    RECEIPT_BYTES,
    ReceiptPage,
    decode_page,
    decode_receipts,
    encode_page,
    encode_receipts,
)
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import open_database
from tests.node.sealed_receipts import keep_sealed

DOMAIN = ledger_domain(31337, "0x" + "ef" * 20)
TERMS = ReceiptTerms(run_id=1, domain=DOMAIN, stages=2, units_per_hop=10)
KEYS = {name: keccak(text=f"receipt serving test {name}") for name in ("data", "a", "b")}
ADDRESS = {name: node_address_of(node_public_key(key)) for name, key in KEYS.items()}


def signed(microbatch: int, worker: str = "a", receiver: str = "b") -> SignedReceipt:
    receipt = HopReceipt(
        1, 0, ADDRESS["data"], 0, microbatch, 1, FORWARD, 0, ADDRESS[worker], ADDRESS[receiver],
        keccak(b"in"), keccak(microbatch.to_bytes(8, "big")), 10,
    )  # fmt: skip
    return SignedReceipt(
        receipt,
        sign_receipt(receipt, DOMAIN, KEYS[worker]),
        sign_receipt(receipt, DOMAIN, KEYS[receiver]),
    )


def test_a_node_serves_its_receipts_and_a_certificate_with_proofs_in_pages(
    tmp_path: Path,
) -> None:
    store = BatchStore(open_database(f"sqlite:///{tmp_path / 'a.sqlite'}"), DOMAIN)
    mine = [signed(m) for m in range(MAX_PAGE + 44)]  # two pages
    complete = mine[:-4]  # the last four's batch never countersigned: not served
    keep_sealed(store, complete, WORKER)
    keep_sealed(store, [replace(e, counterparty_signature=b"") for e in mine[-4:]], WORKER)
    received = [signed(1000 + m, worker="b", receiver="a") for m in range(5)]
    keep_sealed(store, received, RECEIVER)
    tree = build_certificate_tree(mine, DOMAIN)
    # Epoch 1's tree holds the receipts of its first page only: a reading of it breaks off.
    cut = replace(
        tree, entries=tuple(e if i < MAX_PAGE else None for i, e in enumerate(tree.entries))
    )
    server = ReceiptServer(store, TERMS, {0: tree, 1: cut}.get)
    broken: list[Fetched] = []
    pages: dict[int, tuple[ReceiptPage, ...]] = {}
    declined: list[str] = []

    async def refuse(_peer: str) -> bool:
        return False  # the client is outside the run: served in public, within the rate

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as server_host,
            running_host(identity_from_key(KEYS["b"])) as client_host,
        ):
            # A burst of one request and four a second: the pages after the first are declined
            # as busy and asked again.
            rate = PublicRate(per_s=4.0, burst=1.0)
            server.serve(RequestResponse(server_host, admit=refuse), 5.0, rate)
            await client_host.connect(peer_info(full_address(server_host)))
            client = RequestResponse(client_host)
            peer = str(peer_id_of(identity_from_key(KEYS["a"])))
            with trio.fail_after(30):
                for which in (SIGNED, RECEIVED, CERTIFIED):
                    fetched = await fetch_receipts(client, peer, 1, 0, which, 5.0)
                    assert fetched.stopped is None, fetched.stopped
                    pages[which] = fetched.pages
                broken.append(await fetch_receipts(client, peer, 1, 1, CERTIFIED, 5.0))
                empty = await fetch_receipts(client, peer, 1, 7, SIGNED, 5.0)
                assert empty.pages == (ReceiptPage(0, 0, ()),) and empty.stopped is None
                for run, epoch, which in ((2, 0, SIGNED), (1, 3, CERTIFIED)):
                    refused = await fetch_receipts(client, peer, run, epoch, which, 5.0)
                    assert refused.pages == () and refused.stopped is not None
                    declined.append(refused.stopped)

    trio.run(main)
    assert [len(p.entries) for p in pages[SIGNED]] == [MAX_PAGE, len(complete) - MAX_PAGE]
    served = [e for page in pages[SIGNED] for e in page.entries]
    assert sorted(served, key=lambda e: hop_key(e.receipt)) == served, "in hop key order"
    assert set(served) == set(complete)
    assert {e for page in pages[RECEIVED] for e in page.entries} == set(received)
    # The certificate: every leaf's proof checks against the root, each receipt is its leaf's.
    leaves = [
        (e, leaf) for p in pages[CERTIFIED] for e, leaf in zip(p.entries, p.leaves, strict=True)
    ]
    assert len(leaves) == tree.count == len(mine)
    for entry, leaf in leaves:
        assert verify_proof(leaf.proof, tree.root, leaf.hop.leaf())
        assert leaf.hop.receiptDigest == check_signatures(entry, DOMAIN)
    assert len(declined) == 2
    # What was read before the break is kept, and the break is said.
    (partial,) = broken
    assert [len(p.entries) for p in partial.pages] == [MAX_PAGE]
    assert partial.stopped is not None and "not all held" in partial.stopped


def test_a_page_round_trips_and_bad_pages_are_refused() -> None:
    entries = tuple(signed(m) for m in range(3))
    tree = build_certificate_tree(list(entries), DOMAIN)
    for page in (ReceiptPage(10, 4, entries), certified_page(tree, 1, 5), ReceiptPage(0, 0, ())):
        assert decode_page(encode_page(page)) == page
    with pytest.raises(ProtocolError):
        encode_page(ReceiptPage(1000, 0, tuple(signed(0) for _ in range(MAX_PAGE + 1))))
    raw = encode_page(ReceiptPage(3, 0, entries))
    for bad in (raw[:-1], raw + b"\x00", raw[:4] + b"\x00\x00\x00\x03" + raw[8:]):
        with pytest.raises(ProtocolError):
            decode_page(bad)


def test_a_reported_receipt_is_its_fields_packed_in_struct_order_then_both_signatures() -> None:
    entry = signed(5)
    r = entry.receipt
    # The layout, spelled out: uint256, uint64, address, uint64 ×2, uint16, uint8, uint16,
    # address ×2, bytes32 ×2, uint64, then the worker's and the counterparty's signatures.
    expected = struct.pack(
        ">H32sQ20sQQHBH20s20s32s32sQ65s65s", 1, r.runId.to_bytes(32, "big"), r.epoch,
        bytes.fromhex(r.dataNode[2:]), r.iteration, r.microbatchId, r.stage, r.direction,
        r.attempt, bytes.fromhex(r.worker[2:]), bytes.fromhex(r.counterparty[2:]),
        r.inputDigest, r.outputDigest, r.units, entry.worker_signature,
        entry.counterparty_signature,
    ) + b"\x00"  # fmt: skip
    assert encode_receipts([entry]) == expected and len(expected) == 2 + RECEIPT_BYTES + 1 == 326
    assert decode_receipts(expected) == [entry]


def test_a_receipt_signed_in_a_batch_travels_with_its_proof_and_a_long_proof_is_refused() -> None:
    """then its proof in the batch: a length byte and the hashes."""
    entry = signed(5)
    proof = tuple(bytes([i]) * 32 for i in range(3))
    batched = SignedReceipt(
        entry.receipt, entry.worker_signature, entry.counterparty_signature, proof
    )
    data = encode_receipts([batched, entry])
    assert decode_receipts(data) == [batched, entry]
    assert data[2 + RECEIPT_BYTES] == 3
    for bad in (
        data[:-1],
        data + b"\x00",
        data[: 2 + RECEIPT_BYTES] + b"\x41" + data[3 + RECEIPT_BYTES :],
    ):
        with pytest.raises(ProtocolError):
            decode_receipts(bad)
    too_long = SignedReceipt(entry.receipt, b"\x01" * 65, b"\x01" * 65, (b"\x00" * 32,) * 65)
    with pytest.raises(ProtocolError):
        encode_receipts([too_long])


@given(st.binary(max_size=1200))
def test_arbitrary_page_bytes_raise_only_a_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):  # anything else fails the test
        decode_page(data)


def test_peers_outside_the_run_share_one_rate() -> None:
    rate = PublicRate(per_s=2.0, burst=3.0)
    assert [rate.take(0.0) for _ in range(4)] == [True, True, True, False], "a burst, then no"
    assert not rate.take(0.4) and rate.take(0.5), "refilled at 2 per second"
    assert [rate.take(100.0) for _ in range(4)] == [True, True, True, False], "never over burst"


def test_a_node_that_drips_short_pages_has_its_reading_ended() -> None:
    """An honest node fills every page but the last; one that serves a receipt a page (which
    would cost a reader one request per receipt, within the public rate) ends the reading: as
    failed for its signed receipts, and whole for its certificate read directly, the leaves
    it left out being its own withholding."""
    tree = build_certificate_tree([signed(m) for m in range(3)], DOMAIN)
    request = struct.Struct(">QQBIH")
    fetched: list[Fetched] = []

    async def drip(_peer: str, asked: bytes) -> bytes:
        _run, _epoch, _which, offset, _size = request.unpack(asked)
        return encode_page(certified_page(tree, offset, 1))

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as server_host,
            running_host(identity_from_key(KEYS["b"])) as client_host,
        ):
            limits = RpcLimits(request.size, 1 << 20, 5.0)
            RequestResponse(server_host).serve(RECEIPTS_PROTOCOL, drip, limits)
            await client_host.connect(peer_info(full_address(server_host)))
            client = RequestResponse(client_host)
            peer = str(peer_id_of(identity_from_key(KEYS["a"])))
            with trio.fail_after(30):
                fetched.append(await fetch_receipts(client, peer, 1, 0, CERTIFIED, 5.0))
                fetched.append(await fetch_receipts(client, peer, 1, 0, SIGNED, 5.0))
                # Asked for one at a time, the same pages are whole.
                fetched.append(await fetch_receipts(client, peer, 1, 0, CERTIFIED, 5.0, limit=1))

    trio.run(main)
    withheld, dripped, one = fetched
    assert [len(p.entries) for p in withheld.pages] == [1] and withheld.stopped is None
    assert dripped.pages == () and dripped.stopped is not None
    assert f"a page of 1 receipts from 0 of 3, where {MAX_PAGE} were asked" in dripped.stopped
    assert [len(p.entries) for p in one.pages] == [1] and "stopped at 1" in str(one.stopped)

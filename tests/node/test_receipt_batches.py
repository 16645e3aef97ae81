"""Receipts signed in batches (``gwtf.node.receipts.batching``, ``gwtf.node.store.batches``):
assembly, closing, the receiver's checks, a receiver that withholds its countersignature, the
attacks on each rule, and what a crash leaves."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from eth_utils.crypto import keccak
from sqlalchemy import create_engine, event, text

from gwtf.contracts.batches import batch_of, sign_batch
from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt, build_certificate_tree
from gwtf.contracts.encoding import (
    FORWARD,
    HopBatch,
    HopReceipt,
    hop_key,
    ledger_domain,
    node_address_of,
    node_public_key,
    receipt_digest,
    recover_signer,
    sign_digest,
)
from gwtf.errors import ProtocolError
from gwtf.node.audit.checks import equivocations
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import Decline, RequestResponse, RpcLimits
from gwtf.node.receipts import ReceiptsConfig, grace_for
from gwtf.node.receipts.batch_closing import (
    CLOSE_PROTOCOL,
    MAX_CONCURRENT_CLOSES,
    MAX_NOT_YET,
    BatchCloser,
    answer_of,
)
from gwtf.node.receipts.batching import (
    MAX_BATCH_HOPS,
    BatchBook,
    BatchSettings,
    CloseRequest,
    Withholders,
)
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.certify import check_report
from gwtf.node.receipts.wire import RECEIPT_BYTES, decode_receipts, encode_receipts
from gwtf.node.store.batches import RECEIVER, WORKER, BatchPending, BatchRefused, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import CHUNK, ConflictingReceipt, HopStore, ToSign

DOMAIN = ledger_domain(31337, "0x" + "ab" * 20)
KEYS = {n: keccak(text=f"batch test {n}") for n in ("a", "b", "c", "data")}
ADDR = {n: node_address_of(node_public_key(k)) for n, k in KEYS.items()}
TERMS = ReceiptTerms(1, DOMAIN, 2, 10)


def receipt(i: int, worker: str = "a", receiver: str = "b", epoch: int = 0) -> HopReceipt:
    return HopReceipt(
        1, epoch, ADDR["data"], 0, i, 1, FORWARD, 0, ADDR[worker], ADDR[receiver],
        keccak(b"in" + bytes([i])), keccak(b"out" + bytes([i])), 10,
    )  # fmt: skip


def book(tmp: Path, name: str, settings: BatchSettings | None = None, **kw: object) -> BatchBook:
    store = BatchStore(open_database(f"sqlite:///{tmp / name}.sqlite"), DOMAIN)
    return BatchBook(DOMAIN, KEYS[name], store, settings or BatchSettings(), **kw)  # type: ignore[arg-type]


POSTGRES_URL = os.environ.get("GWTF_TEST_POSTGRES_URL", "")


@pytest.fixture(params=["sqlite", "postgresql"])
def node_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """A database URL per node name: a file each on SQLite, a schema each on PostgreSQL."""
    if request.param == "sqlite":
        yield lambda name: f"sqlite:///{tmp_path / name}.sqlite"
        return
    if not POSTGRES_URL:
        if os.environ.get("CI"):
            pytest.fail("CI must run the PostgreSQL cases: set GWTF_TEST_POSTGRES_URL")
        pytest.skip("no PostgreSQL server: set GWTF_TEST_POSTGRES_URL (.ci/run starts one)")
    engine = create_engine(POSTGRES_URL)
    schemas: list[str] = []

    def url(name: str) -> str:
        schema = f"batch_test_{name}"
        with engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        schemas.append(schema)
        return (
            f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}options=-csearch_path%3D{schema}"
        )

    try:
        yield url
    finally:
        with engine.begin() as connection:
            for schema in schemas:
                connection.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


def db_book(url: str, name: str, settings: BatchSettings | None = None) -> BatchBook:
    store = BatchStore(open_database(url), DOMAIN)
    return BatchBook(DOMAIN, KEYS[name], store, settings or BatchSettings())


def both_record(a: BatchBook, b: BatchBook, receipts: list[HopReceipt]) -> None:
    assert all(a.record(receipts, now=0.0, sender=ADDR["a"]))
    assert all(b.record(receipts, now=0.0, sender=ADDR["a"]))


def test_recording_one_ends_receipts_opens_one_transaction(tmp_path: Path) -> None:
    """A receiver's record of one peer's hops (the live node records each sender's apart)
    commits once: no empty transaction for the worker's side it has none of."""
    b = book(tmp_path, "b")
    begun: list[object] = []
    event.listen(b.store.db.engine, "begin", begun.append)
    assert b.record([receipt(0), receipt(1)], now=0.0, sender=ADDR["a"]) == [True, True]
    assert len(begun) == 1


def test_a_closed_batch_is_countersigned_and_each_receipt_checks_with_its_proof(
    tmp_path: Path,
) -> None:
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(5)]
    both_record(a, b, receipts)
    request = a.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None and len(request.hop_keys) == 5
    assert request.hop_keys == tuple(sorted(hop_key(r) for r in receipts))
    answer = b.countersign(CloseRequest.decode(request.encode()), ADDR["a"])
    assert a.answered(request, "peer-b", answer, "")
    for node in (a, b):
        (closed,) = node.sealed(1, 0)
        sealed = closed.sealed(DOMAIN)
        assert {s.receipt for s in sealed} == set(receipts)
        for s in sealed:
            assert len(s.proof) >= 2  # a real batch: proofs, not batches of one
            assert recover_signer(s.receipt, DOMAIN, s.worker_signature, s.proof) == ADDR["a"]
            assert recover_signer(s.receipt, DOMAIN, s.counterparty_signature, s.proof) == ADDR["b"]
            PreparedHop.of(s, DOMAIN)  # the data node's check of a reported receipt
    # The same request again is answered with the same countersignature, no second batch.
    assert b.countersign(request, ADDR["a"]) == answer
    assert a.close(1, 0, ADDR["b"], now=2.0) is None


def test_a_batch_closes_every_n_hops_after_t_seconds_and_at_the_iterations_end(
    tmp_path: Path,
) -> None:
    a = book(tmp_path, "a", BatchSettings(max_hops=3, max_age_s=5.0))
    a.record([receipt(0)], now=0.0, sender=ADDR["a"])
    a.record([receipt(10, receiver="c")], now=0.0, sender=ADDR["a"])
    assert a.due(now=1.0) == []
    assert set(a.due(now=1.0, iteration_end=True)) == {(1, 0, ADDR["b"]), (1, 0, ADDR["c"])}
    assert a.due(now=5.0) == [(1, 0, ADDR["b"]), (1, 0, ADDR["c"])]
    a.record([receipt(1), receipt(2)], now=1.0, sender=ADDR["a"])
    assert (1, 0, ADDR["b"]) in a.due(now=1.0)
    a.record([receipt(3)], now=1.0, sender=ADDR["a"])
    request = a.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None and len(request.hop_keys) == 3  # at most max_hops a batch
    assert a.due(now=2.0) == []  # one left open, counted from now
    assert set(a.due(now=6.0)) == {(1, 0, ADDR["b"]), (1, 0, ADDR["c"])}


@pytest.mark.parametrize(
    "settings",
    [
        {"max_hops": 0},
        {"max_hops": MAX_BATCH_HOPS + 1},
        {"max_age_s": 0.0},
        {"max_age_s": 1e9},
        {"close_timeout_s": -1.0},
    ],
)
def test_batch_settings_are_bounded(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BatchSettings(**settings)  # type: ignore[arg-type]


def test_a_receiver_refuses_a_batch_naming_the_first_hop_it_lacks(tmp_path: Path) -> None:
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(4)]
    a.record(receipts, now=0.0, sender=ADDR["a"])
    b.record(
        [r for r in receipts if r.microbatchId != 2], now=0.0, sender=ADDR["a"]
    )  # never got hop 2
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    with pytest.raises(BatchRefused, match=hop_key(receipts[2]).hex()):
        b.countersign(request, ADDR["a"])
    assert b.sealed(1, 0) == []  # nothing countersigned, nothing committed


def test_a_worker_stops_sending_to_a_receiver_that_withholds_and_nothing_is_slashable(
    tmp_path: Path,
) -> None:
    charged: list[tuple[str, str]] = []
    withholders = Withholders(penalise=lambda peer, why: charged.append((peer, why)))
    a, b = book(tmp_path, "a", withholders=withholders), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(3)]
    both_record(a, b, receipts)
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    # The receiver acked every hop but lets the close time out.
    assert not a.answered(request, "peer-b", None, "no answer in 10 s")
    assert charged == [("peer-b", "no answer in 10 s")]
    assert not withholders.may_send("peer-b") and withholders.may_send("peer-c")
    # Unpaid, not slashable: no complete receipt exists, so none is reported or certified,
    # and the worker signed these hops in exactly one batch.
    assert a.sealed(1, 0) == [] and b.sealed(1, 0) == []
    assert [u.batch for u in a.store.unanswered(1, 0)] == [request.batch]
    assert a.close(1, 0, ADDR["b"], now=1.0) is None
    withholders.new_iteration()
    assert withholders.may_send("peer-b")


def test_a_countersignature_over_another_root_is_refused_as_withheld(tmp_path: Path) -> None:
    """A receiver that countersigns a root missing one of the worker's hops gives the worker
    nothing: its signature does not check over the worker's batch."""
    a = book(tmp_path, "a")
    a.record([receipt(i) for i in range(3)], now=0.0, sender=ADDR["a"])
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    short = HopBatch.of(receipt(0), receipt_digest(receipt(0), DOMAIN))
    forged = sign_digest(short.digest(DOMAIN), KEYS["b"])
    assert not a.answered(request, "peer-b", forged, "")
    assert not a.withholders.may_send("peer-b")
    assert a.sealed(1, 0) == []


def test_a_batch_padded_with_another_workers_receipt_is_refused(tmp_path: Path) -> None:
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    mine, theirs = [receipt(0), receipt(1)], receipt(7, worker="c")
    both_record(a, b, mine)
    b.record([theirs], now=0.0, sender=ADDR["c"])
    padded = sorted([*mine, theirs], key=hop_key)
    with pytest.raises(ProtocolError):  # no batch of two workers can even be built
        batch_of(padded, DOMAIN)
    # The attacker signs a batch of its own scope naming c's hop: the receiver refuses it.
    batch = HopBatch.of(mine[0], keccak(b"whatever"))
    request = CloseRequest(
        batch, sign_digest(batch.digest(DOMAIN), KEYS["a"]), tuple(hop_key(r) for r in padded)
    )
    with pytest.raises(BatchRefused, match=hop_key(theirs).hex()):
        b.countersign(request, ADDR["a"])


def test_a_batch_replayed_in_another_epoch_or_by_another_sender_is_refused(
    tmp_path: Path,
) -> None:
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    both_record(a, b, [receipt(i) for i in range(2)])
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    moved = HopBatch(1, 1, ADDR["a"], ADDR["b"], request.batch.root)
    with pytest.raises(BatchRefused, match="not its worker's"):  # the old signature
        b.countersign(CloseRequest(moved, request.worker_signature, request.hop_keys), ADDR["a"])
    resigned = CloseRequest(moved, sign_digest(moved.digest(DOMAIN), KEYS["a"]), request.hop_keys)
    with pytest.raises(BatchRefused, match="no open receipt"):  # epoch 0's hops
        b.countersign(resigned, ADDR["a"])
    with pytest.raises(BatchRefused, match="sent by"):
        b.countersign(request, ADDR["c"])
    other_run = HopBatch(2, 0, ADDR["a"], ADDR["b"], request.batch.root)
    with pytest.raises(BatchRefused):
        b.countersign(
            CloseRequest(
                other_run, sign_digest(other_run.digest(DOMAIN), KEYS["a"]), request.hop_keys
            ),
            ADDR["a"],
        )
    assert b.countersign(request, ADDR["a"])  # the genuine one still closes


def test_a_hop_key_holds_one_receipt_across_batches_and_the_per_hop_tables(
    tmp_path: Path,
) -> None:
    a = book(tmp_path, "a")
    assert a.record([receipt(0)], now=0.0, sender=ADDR["a"]) == [True]
    changed = replace(receipt(0), outputDigest=keccak(b"other"))
    assert hop_key(changed) == hop_key(receipt(0))
    assert a.record([changed], now=0.0, sender=ADDR["a"]) == [False]
    # A hop already signed per hop (batch of one) is not batched with another receipt either.
    per_hop = HopStore(a.store.db)
    other = receipt(5)
    per_hop.sign_once(
        [ToSign(hop_key(other), other, receipt_digest(other, DOMAIN), lambda: b"\x01" * 65)]
    )
    forged = replace(other, outputDigest=keccak(b"x"))
    assert a.record([forged], now=0.0, sender=ADDR["a"]) == [False]
    assert a.record([other], now=0.0, sender=ADDR["a"]) == [
        True
    ]  # the same receipt is the same commitment


def test_a_receiver_never_countersigns_per_hop_a_hop_it_committed_for_a_batch(
    node_url: Callable[[str], str],
) -> None:
    """A worker sends hop K on the batched path, then another version of K on the per-hop
    path: the receiver's one commitment per hop key refuses the second (else: slashable)."""
    a, b = db_book(node_url("a"), "a"), db_book(node_url("b"), "b")
    first = receipt(0)
    second = replace(first, outputDigest=keccak(b"other"))
    both_record(a, b, [first])
    digest = receipt_digest(second, DOMAIN)
    signing = HopBatch.of(second, digest).digest(DOMAIN)
    worker_signature = sign_digest(signing, KEYS["a"])
    (counter,) = HopStore(b.store.db).countersign_once(
        [ToSign(hop_key(second), second, digest, lambda: sign_digest(signing, KEYS["b"]),
                worker_signature)]
    )  # fmt: skip
    assert isinstance(counter, ConflictingReceipt)
    request = a.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None and a.answered(request, "b", b.countersign(request, ADDR["a"]), "")
    assert equivocations(b.sealed(1, 0)[0].sealed(DOMAIN), DOMAIN) == []


def test_a_worker_never_signs_per_hop_a_hop_it_committed_for_a_batch(
    node_url: Callable[[str], str],
) -> None:
    a = db_book(node_url("a"), "a")
    first = receipt(0)
    second = replace(first, outputDigest=keccak(b"other"))
    assert a.record([first], now=0.0, sender=ADDR["a"]) == [True]
    per_hop = HopStore(a.store.db)
    digest = receipt_digest(second, DOMAIN)
    (signed,) = per_hop.sign_once([ToSign(hop_key(second), second, digest, lambda: b"\x01" * 65)])
    assert isinstance(signed, ConflictingReceipt)
    # The receipt it committed to is the one it may still sign per hop.
    same = receipt_digest(first, DOMAIN)
    (signed,) = per_hop.sign_once([ToSign(hop_key(first), first, same, lambda: b"\x02" * 65)])
    assert signed == b"\x02" * 65


def test_a_third_party_cannot_plant_a_receipt_under_another_workers_hop_key(
    tmp_path: Path,
) -> None:
    """c sends b a hop claiming a's future hop key with another output: not recorded (its
    sender is not its worker), so a's real hop is recorded and a's batch countersigned."""
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    real = [receipt(i) for i in range(3)]
    planted = replace(real[1], outputDigest=keccak(b"planted by c"))
    assert b.record([planted, receipt(9, worker="c")], now=0.0, sender=ADDR["c"]) == [False, True]
    both_record(a, b, real)
    request = a.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None
    assert a.answered(request, "peer-b", b.countersign(request, ADDR["a"]), "")


def test_a_crash_before_the_batch_commit_signs_nothing_and_after_it_resends_the_same(
    tmp_path: Path,
) -> None:
    a = book(tmp_path, "a")
    receipts = [receipt(i) for i in range(3)]
    a.record(receipts, now=0.0, sender=ADDR["a"])

    def crash(_: bytes) -> bytes:
        raise KeyboardInterrupt  # the process dies between its receipts' commit and the close

    with pytest.raises(KeyboardInterrupt):
        a.store.close(1, 0, ADDR["a"], ADDR["b"], 10, crash)
    restarted = book(tmp_path, "a")
    assert restarted.resume(1, 0, now=1.0) == []  # no batch was kept, none signed
    assert restarted.due(now=1.0, iteration_end=True) == [(1, 0, ADDR["b"])]
    request = restarted.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None and len(request.hop_keys) == 3
    # A crash after the batch's commit: the restarted node sends that batch again as it is,
    # and its hops never join another.
    again = book(tmp_path, "a")
    assert again.resume(1, 0, now=2.0) == [request]
    assert again.due(now=2.0, iteration_end=True) == []
    (unanswered,) = again.store.unanswered(1, 0)
    assert again.close(1, 0, ADDR["b"], now=2.0) is None
    with pytest.raises(ConflictingReceipt):
        again.store._commit(unanswered, WORKER, [bytes(32)] * len(unanswered.hop_keys))


def test_close_requests_are_bounded_and_malformed_ones_refused() -> None:
    batch = HopBatch(1, 0, ADDR["a"], ADDR["b"], keccak(b"r"))
    request = CloseRequest(batch, b"\x01" * 65, (keccak(b"k"),))
    assert CloseRequest.decode(request.encode()) == request
    data = request.encode()
    for bad in (data[:10], data[:-1], data + b"\x00", data[:-34] + b"\x00\x00" + data[-32:]):
        with pytest.raises(ProtocolError):
            CloseRequest.decode(bad)


@pytest.mark.parametrize(("run_id", "epoch"), [(2**255, 0), (2**63, 0), (1, 2**64 - 1)])
def test_a_close_request_of_a_run_or_epoch_no_database_holds_is_malformed(
    run_id: int, epoch: int
) -> None:
    """Else the receiver's store raises OverflowError (SQLite) or DataError (PostgreSQL)."""
    batch = HopBatch(run_id, epoch, ADDR["a"], ADDR["b"], keccak(b"r"))
    data = CloseRequest(batch, sign_digest(batch.digest(DOMAIN), KEYS["a"]), (keccak(b"k"),))
    with pytest.raises(ProtocolError, match="below 2\\*\\*63"):
        CloseRequest.decode(data.encode())


def test_a_node_records_only_its_own_hops(tmp_path: Path) -> None:
    a = book(tmp_path, "a")
    with pytest.raises(ProtocolError):
        a.record([receipt(0, worker="b", receiver="c")], now=0.0, sender=ADDR["a"])
    assert RECEIVER != WORKER


def test_sealed_receipts_are_reported_certified_and_audited_with_their_proofs(
    tmp_path: Path,
) -> None:
    """What a batch hands the data node goes through the report's bytes, the data node's
    checks and store, its certificate tree and the audit's equivocation check as a batch of
    one does; only two batches holding different receipts of one hop convict."""
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(6)]
    both_record(a, b, receipts)
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    assert a.answered(request, "peer-b", b.countersign(request, ADDR["a"]), "")
    (closed,) = a.sealed(1, 0)
    reported = decode_receipts(encode_receipts(closed.sealed(DOMAIN)))
    terms = ReceiptTerms(1, DOMAIN, 2, 10)
    prepared = [check_report(e, terms, ADDR["data"], ADDR["a"]) for e in reported]
    data_node = HopStore(open_database(f"sqlite:///{tmp_path / 'data'}.sqlite"))
    data_node.add_reported(prepared)
    kept = data_node.reported_hops(1, 0)
    assert {p.entry for p in kept} == set(reported) and all(p.entry.proof for p in kept)
    tree = build_certificate_tree([p.entry for p in kept], DOMAIN)
    assert tree.count == 6
    assert equivocations(reported, DOMAIN) == []
    # The worker signing hop 0 again, changed, in another batch is convicted by the pair.
    changed = replace(receipts[0], outputDigest=keccak(b"changed"))
    other = sign_batch([changed, receipt(9)], DOMAIN, KEYS["a"], KEYS["b"])
    (finding, *_) = equivocations([*reported, *other], DOMAIN)
    assert finding.proof is not None


def test_a_batch_whose_receipts_differ_from_the_receivers_is_refused(tmp_path: Path) -> None:
    """A worker that claims another output for a hop than the receiver got: same hop keys,
    another root; the receiver refuses it and signs nothing."""
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(3)]
    lied = [replace(receipts[0], outputDigest=keccak(b"not what b got")), *receipts[1:]]
    a.record(lied, now=0.0, sender=ADDR["a"])
    b.record(receipts, now=0.0, sender=ADDR["a"])
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    with pytest.raises(BatchRefused, match="root is not the one"):
        b.countersign(request, ADDR["a"])
    assert b.sealed(1, 0) == [] and b.store.unanswered(1, 0) == []


# ---------------------------------------------------------------- over libp2p


def closing_pair(tmp_path: Path) -> tuple[BatchBook, BatchBook, list[tuple[str, str]]]:
    charged: list[tuple[str, str]] = []
    withholders = Withholders(penalise=lambda peer, why: charged.append((peer, why)))
    settings = BatchSettings(max_hops=64, close_timeout_s=1.0)
    a = book(tmp_path, "a", settings, withholders=withholders)
    return a, book(tmp_path, "b", settings), charged


def run_closing(
    a: BatchBook, b: BatchBook, stall_receiver: bool = False, now: float = 0.0
) -> tuple[int, BatchCloser, BatchCloser]:
    peers = {n: str(peer_id_of(identity_from_key(KEYS[n]))) for n in "ab"}
    result: list[int] = []
    closers: list[BatchCloser] = []

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as a_host,
            running_host(identity_from_key(KEYS["b"])) as b_host,
        ):
            worker = BatchCloser(RequestResponse(a_host), a, {ADDR["b"]: peers["b"]}.get)
            receiver = BatchCloser(RequestResponse(b_host), b, {}.get)
            if stall_receiver:  # acks every hop, never answers a close

                async def stall(peer: str, data: bytes) -> bytes:
                    await trio.sleep_forever()
                    raise AssertionError

                RequestResponse(b_host).serve(CLOSE_PROTOCOL, stall, RpcLimits())
            else:
                receiver.serve()
            await a_host.connect(peer_info(full_address(b_host)))
            with trio.fail_after(30):
                result.append(await worker.close_due(now=now, iteration_end=True))
            closers.extend([worker, receiver])

    trio.run(main)
    return result[0], closers[0], closers[1]


def test_a_batch_closes_over_libp2p_and_both_ends_hold_it_whole(tmp_path: Path) -> None:
    a, b, charged = closing_pair(tmp_path)
    both_record(a, b, [receipt(i) for i in range(70)])  # two batches: 64 and 6
    done, _, receiver = run_closing(a, b)
    assert done == 1 and receiver.countersigned == 1  # one batch of 64 due now
    assert charged == [] and [len(c.receipts) for c in a.sealed(1, 0)] == [64]
    done, _, _ = run_closing(a, b)
    assert done == 1 and sorted(len(c.receipts) for c in b.sealed(1, 0)) == [6, 64]


def test_a_receiver_that_never_answers_its_closes_is_stopped_for_the_iteration_uncharged(
    tmp_path: Path,
) -> None:
    """A timeout is no proof of withholding (the receiver may have crashed): its closes of
    three epochs in flight at once time out, and it is stopped for the rest of the iteration,
    charged nothing (a charge each would ban a relay that restarted); its batches are sent
    again once it answers."""
    a, b, charged = closing_pair(tmp_path)
    both_record(a, b, [receipt(i, epoch=e) for e in range(3) for i in range(3 * e, 3 * e + 3)])
    done, _, _ = run_closing(a, b, stall_receiver=True)
    peer_b = str(peer_id_of(identity_from_key(KEYS["b"])))
    assert done == 0 and charged == [] and len(a.pending_requests()) == 3
    assert not a.withholders.may_send(peer_b) and not a.withholders.may_close(peer_b)
    assert a.sealed(1, 0) == [] and b.sealed(1, 0) == []  # unpaid, nothing to slash
    # Stopped for the iteration: its next batches are not even closed, so nothing is sent.
    both_record(a, b, [receipt(i) for i in range(10, 12)])
    assert run_closing(a, b, stall_receiver=True)[0] == 0 and charged == []
    assert a.store.open_counts(1, 0, ADDR["a"]) == {ADDR["b"]: 2}
    # Next iteration it answers again: the unanswered batches are sent again as they were.
    unanswered = a.pending_requests()
    a.withholders.new_iteration()
    assert run_closing(a, b)[0] == 4 and a.pending_requests() == [] and charged == []
    assert sorted(len(c.receipts) for c in b.sealed(1, 0)) == [2, 3]
    assert {r.batch for r in unanswered} <= {c.batch for e in range(3) for c in a.sealed(1, e)}
    assert a.withholders.may_send(peer_b)


def test_a_close_that_overtook_a_hop_is_sent_again_until_it_is_held_or_too_old(
    tmp_path: Path,
) -> None:
    """ "Not yet" (the receiver holds no receipt of a hop yet) charges nobody: the request is
    sent again at each close_due; a receiver still lacking a hop max_age_s later withholds."""
    a, b, charged = closing_pair(tmp_path)
    peer_b = str(peer_id_of(identity_from_key(KEYS["b"])))
    receipts = [receipt(i) for i in range(3)]
    a.record(receipts, now=0.0, sender=ADDR["a"])
    b.record(receipts[1:], now=0.0, sender=ADDR["a"])  # hop 0 still on its way
    done, _, receiver = run_closing(a, b, now=0.0)
    assert done == 0 and receiver.refused == 0 and charged == [] and a.withholders.may_send(peer_b)
    assert len(a.pending_requests()) == 1
    b.record(receipts[:1], now=1.0, sender=ADDR["a"])
    done, _, _ = run_closing(a, b, now=1.0)
    assert done == 1 and a.pending_requests() == [] and charged == []
    never = receipt(5)
    a.record([never], now=2.0, sender=ADDR["a"])
    assert run_closing(a, b, now=2.0)[0] == 0 and charged == []
    assert run_closing(a, b, now=2.0 + a.settings.max_age_s)[0] == 0
    ((peer, why),) = charged
    assert peer == peer_b and why.startswith("still not yet") and hop_key(never).hex() in why
    assert not a.withholders.may_send(peer_b)


def test_a_receiver_that_times_out_is_not_sent_its_other_batches_that_round(
    tmp_path: Path,
) -> None:
    """Batches a receiver left unanswered are sent again at the next iteration; once one of
    them times out, the rest still waiting for a slot are not sent (each would cost another
    close timeout, the round's closes to other receivers waiting behind them)."""
    charged: list[tuple[str, str]] = []
    withholders = Withholders(penalise=lambda peer, why: charged.append((peer, why)))
    a = book(tmp_path, "a", BatchSettings(max_hops=1, close_timeout_s=1.0), withholders=withholders)
    peer_b = str(peer_id_of(identity_from_key(KEYS["b"])))
    count = MAX_CONCURRENT_CLOSES + 2
    a.record([receipt(i) for i in range(count)], now=0.0, sender=ADDR["a"])
    for _ in range(count):
        request = a.close(1, 0, ADDR["b"], now=0.0)
        assert request is not None
        a.answered(request, peer_b, None, "no answer: cut", now=0.0, unreachable=True)
    assert len(a.pending_requests()) == count
    a.withholders.new_iteration()
    asked: list[int] = []

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as a_host,
            running_host(identity_from_key(KEYS["b"])) as b_host,
        ):
            worker = BatchCloser(RequestResponse(a_host), a, {ADDR["b"]: peer_b}.get)

            async def stall(peer: str, data: bytes) -> bytes:
                asked.append(1)
                await trio.sleep_forever()
                raise AssertionError

            RequestResponse(b_host).serve(CLOSE_PROTOCOL, stall, RpcLimits())
            await a_host.connect(peer_info(full_address(b_host)))
            with trio.fail_after(30):
                assert await worker.close_due(now=0.0) == 0

    trio.run(main)
    assert 1 <= len(asked) <= MAX_CONCURRENT_CLOSES, asked
    assert len(a.pending_requests()) == count, "all still to be sent again"


def test_a_refusal_over_libp2p_says_why_and_charges_the_receiver(tmp_path: Path) -> None:
    a, b, charged = closing_pair(tmp_path)
    receipts = [receipt(i) for i in range(3)]
    a.record(receipts, now=0.0, sender=ADDR["a"])
    other = replace(receipts[0], outputDigest=keccak(b"not what a sent"))
    b.record([other, *receipts[1:]], now=0.0, sender=ADDR["a"])
    done, _, receiver = run_closing(a, b)
    assert done == 0 and receiver.refused == 1 and a.pending_requests() == []
    ((_, why),) = charged
    assert why.startswith("refused: ") and "root" in why


def test_a_close_racing_another_over_one_hop_signs_nothing_twice(tmp_path: Path) -> None:
    """Two closes that read the same open hops: the one committed second is aborted whole, so
    its signature never leaves (worker) or becomes a refusal (receiver)."""
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(2)]
    both_record(a, b, receipts)
    first = a.store.close(1, 0, ADDR["a"], ADDR["b"], 10, a._sign)
    assert first is not None
    late = replace(first, batch=HopBatch(1, 0, ADDR["a"], ADDR["b"], keccak(b"other root")))
    with pytest.raises(ConflictingReceipt):
        a.store._commit(late, WORKER, [bytes(32)] * 2)
    assert [c.batch for c in a.store.unanswered(1, 0)] == [first.batch]
    request = CloseRequest(first.batch, first.worker_signature, first.hop_keys)
    counter = b.countersign(request, ADDR["a"])
    raced = replace(first, counterparty_signature=counter, batch=late.batch)
    with pytest.raises(ConflictingReceipt):
        b.store._commit(raced, RECEIVER, [bytes(32)] * 2)


def test_concurrent_closes_of_one_scope_keep_its_open_hops_counted(
    node_url: Callable[[str], str],
) -> None:
    """Two closes of one scope at once (worker threads): each takes its own batch and the
    hops left open stay due; none is forgotten until a restart."""
    a = db_book(node_url("a"), "a", BatchSettings(max_hops=4))
    a.record([receipt(i) for i in range(10)], now=0.0, sender=ADDR["a"])
    signing = a._sign

    def slow(digest: bytes) -> bytes:
        time.sleep(0.2)  # both closes read the open hops before either commits
        return signing(digest)

    a._sign = slow  # type: ignore[method-assign]
    requests: list[CloseRequest | None] = []
    threads = [
        threading.Thread(target=lambda: requests.append(a.close(1, 0, ADDR["b"], now=2.0)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r.hop_keys) for r in requests if r is not None) == [4, 4]
    assert a.store.open_counts(1, 0, ADDR["a"]) == {ADDR["b"]: 2}
    assert a.due(now=2.0, iteration_end=True) == [(1, 0, ADDR["b"])]
    last = a.close(1, 0, ADDR["b"], now=3.0)
    assert last is not None and len(last.hop_keys) == 2


def test_closes_and_batch_reads_are_index_lookups(tmp_path: Path) -> None:
    """A close reads open rows in hop key order off an index of open rows, a report reads a
    batch's rows off (root, leaf): neither scans or sorts what earlier batches left."""
    a = book(tmp_path, "a")
    plans = {}
    with a.store.db.engine.connect() as connection:
        for name, where in (
            ("open", "run_id = 1 AND epoch = 0 AND worker = 'x' AND counterparty = 'y' AND "
                     "role = 'worker' AND batch_root IS NULL ORDER BY hop_key LIMIT 256"),
            ("batch", "batch_root = x'00' ORDER BY leaf_index"),
        ):  # fmt: skip
            rows = connection.exec_driver_sql(
                f"EXPLAIN QUERY PLAN SELECT hop_key FROM batched_receipts WHERE {where}"
            )
            plans[name] = " ".join(str(row[-1]) for row in rows)
    assert "ix_batched_receipts_open" in plans["open"] and "TEMP B-TREE" not in plans["open"]
    assert "ix_batched_receipts_batch" in plans["batch"] and "TEMP B-TREE" not in plans["batch"]


def test_a_receivers_refusal_reason_is_quoted_never_logged_raw() -> None:
    answer, why, pending, _ = answer_of(b"\x00no\n2026-12-07 WARNING forged line\x1b[2J")
    assert answer is None and why.startswith("refused: ") and not pending
    assert "\n" not in why and "\x1b" not in why and "forged line" in why
    key = b"\x07" * 32
    assert answer_of(b"\x02\x00\x01" + key + b"hop\n") == (None, "not yet: 'hop\\n'", True, (key,))
    assert answer_of(b"\x01" + b"\x02" * 65) == (b"\x02" * 65, "", False, ())
    assert answer_of(b"\x01short") == (None, "its answer is not one", False, ())
    # A "not yet" naming no hop, or fewer bytes than it counts, is no answer.
    assert answer_of(b"\x02\x00\x00hop").why == "its answer is not one"
    assert answer_of(b"\x02\x00\x02" + key).why == "its answer is not one"


def test_a_kept_outputs_receipt_its_receiver_never_heard_of_costs_no_other_hop_its_pay(
    tmp_path: Path,
) -> None:
    """A kept output's receipt (a repair's forward) is recorded by its worker before the ack
    that tells the receiver of it; that ack lost, the receiver answers "not yet" for it for
    ever. max_age_s after the first such answer the worker closes the batch's other hops
    again, without it, and charges nobody: both ends are honest."""
    a, b, charged = closing_pair(tmp_path)
    peer_b = str(peer_id_of(identity_from_key(KEYS["b"])))
    receipts = [receipt(i) for i in range(4)]
    lost = receipts[2]
    a.record(receipts[:2] + receipts[3:], now=0.0, sender=ADDR["a"])
    a.record([lost], now=0.0, sender=ADDR["a"], kept=frozenset({hop_key(lost)}))
    b.record([r for r in receipts if r is not lost], now=0.0, sender=ADDR["a"])  # ack lost
    assert run_closing(a, b, now=0.0)[0] == 0 and len(a.pending_requests()) == 1
    assert run_closing(a, b, now=a.settings.max_age_s / 2)[0] == 0
    # Past max_age_s: given up, its other three close at once in a batch both ends hold.
    assert run_closing(a, b, now=a.settings.max_age_s)[0] == 0 and a.pending_requests() == []
    assert a.due(now=a.settings.max_age_s) == [(1, 0, ADDR["b"])]
    assert run_closing(a, b, now=a.settings.max_age_s)[0] == 1
    assert charged == [] and a.withholders.may_send(peer_b)
    (sealed,) = a.sealed(1, 0)
    assert [c.batch for c in b.sealed(1, 0)] == [sealed.batch]
    assert set(sealed.receipts) == set(receipts) - {lost}  # that one unpaid, never signed
    assert a.store.unanswered(1, 0) == [] and a.store.open_counts(1, 0, ADDR["a"]) == {}
    assert a.close(1, 0, ADDR["b"], now=100.0) is None  # nor batched again


def test_a_receiver_naming_acked_hops_not_yet_is_withholding_and_loses_the_worker_none(
    tmp_path: Path,
) -> None:
    """The same rule against a receiver that answers "not yet" for hops it acknowledged (it
    records each before its ack): it gains nothing (the worker's other hops close again and
    are paid) and is charged and stopped as any receiver that withholds."""
    a, b, charged = closing_pair(tmp_path)
    peer_b = str(peer_id_of(identity_from_key(KEYS["b"])))
    receipts = [receipt(i) for i in range(5)]
    both_record(a, b, receipts)
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    dropped = (request.hop_keys[0], request.hop_keys[3])
    assert not a.answered(request, peer_b, None, "not yet", True, 0.0, lacking=dropped)
    assert charged == [] and a.pending_requests() == [request]
    assert not a.answered(request, peer_b, None, "not yet", True, 20.0, lacking=dropped)
    assert [p for p, _ in charged] == [peer_b] and charged[0][1].startswith("still not yet")
    a.withholders.new_iteration()
    assert run_closing(a, b, now=20.0)[0] == 1
    (sealed,) = a.sealed(1, 0)
    assert {hop_key(r) for r in sealed.receipts} == set(request.hop_keys) - set(dropped)
    # Naming a hop that is not in the batch is no answer: charged at once.
    charged.clear()
    both_record(a, b, [receipt(9)])
    request = a.close(1, 0, ADDR["b"], now=30.0)
    assert request is not None
    stranger = (b"\x09" * 32,)
    assert not a.answered(request, peer_b, None, "not yet", True, 30.0, lacking=stranger)
    assert [why for _, why in charged] == ["its 'not yet' names no hop of the batch"]


def test_a_restarted_worker_closes_only_hops_released_before_its_crash(
    node_url: Callable[[str], str],
) -> None:
    """Held receipts (a send not acked yet, a backward waiting on its forward) are held on
    disk: a node that crashed and resumes closes only the hops released before the crash,
    those its receiver holds; the rest stay open, unpaid and never signed."""
    url = node_url("a")
    a = db_book(url, "a")
    receipts = [receipt(i) for i in range(6)]
    held = frozenset(hop_key(r) for r in receipts[2:])
    assert all(a.record(receipts, now=0.0, sender=ADDR["a"], held=held))
    a.release([hop_key(receipts[2])], now=0.0)  # acked; 3, 4, 5 never were
    restarted = db_book(url, "a")
    assert restarted.resume_run(1, now=1.0) == 0
    assert restarted.due(now=1.0, iteration_end=True) == [(1, 0, ADDR["b"])]
    request = restarted.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None
    assert set(request.hop_keys) == {hop_key(r) for r in receipts[:3]}
    assert restarted.close(1, 0, ADDR["b"], now=1.0) is None
    # A batch signed and never answered before a crash is sent again after it.
    again = db_book(url, "a")
    assert again.resume_run(1, now=2.0) == 1 and again.pending_requests() == [request]


def test_a_receipts_batch_proof_travels_as_long_as_the_contracts_take_it() -> None:
    """This node builds batches of at most 2**12 (12-hash proofs); a peer's receipt with a
    longer proof the contracts accept (up to 64) still decodes, and 65 does not."""
    r = receipt(0)
    signature = b"\x01" * 65
    deep = SignedReceipt(r, signature, signature, tuple(keccak(bytes([i])) for i in range(64)))
    assert decode_receipts(encode_receipts([deep])) == [deep]
    data = bytearray(encode_receipts([replace(deep, proof=deep.proof[:1])]))
    data[2 + RECEIPT_BYTES] = 65
    with pytest.raises(ProtocolError):
        decode_receipts(bytes(data) + b"\x00" * 32 * 64)
    with pytest.raises(ProtocolError):
        encode_receipts([replace(deep, proof=(*deep.proof, deep.proof[0]))])


def test_the_same_close_sent_twice_at_once_is_countersigned_once_and_never_refused(
    node_url: Callable[[str], str],
) -> None:
    """A worker resending a close its receiver is still answering: both get the one
    countersignature; the one whose commit lost the race is not a refusal (it would charge an
    honest worker)."""
    a, b = db_book(node_url("a"), "a"), db_book(node_url("b"), "b")
    both_record(a, b, [receipt(i) for i in range(3)])
    request = a.close(1, 0, ADDR["b"], now=1.0)
    assert request is not None
    signing = b._sign

    def slow(digest: bytes) -> bytes:
        time.sleep(0.2)  # both read the open receipts before either commits
        return signing(digest)

    b._sign = slow  # type: ignore[method-assign]
    answers: list[bytes | Exception] = []

    def answer() -> None:
        try:
            answers.append(b.countersign(request, ADDR["a"]))
        except BatchRefused as exc:
            answers.append(exc)

    threads = [threading.Thread(target=answer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 2 and answers[0] == answers[1] and isinstance(answers[0], bytes)
    assert len(b.sealed(1, 0)) == 1


def test_close_due_sends_to_its_receivers_at_once(tmp_path: Path) -> None:
    """A slow receiver does not hold up another's close: c answers only once b has been asked
    (sequential sends would time c out first, and charge it)."""
    charged: list[tuple[str, str]] = []
    settings = BatchSettings(max_hops=64, close_timeout_s=2.0)
    withholders = Withholders(penalise=lambda peer, why: charged.append((peer, why)))
    a = book(tmp_path, "a", settings, withholders=withholders)
    b, c = book(tmp_path, "b", settings), book(tmp_path, "c", settings)
    to_c, to_b = [receipt(i, receiver="c") for i in range(2)], [receipt(i) for i in range(2, 4)]
    a.record(to_c + to_b, now=0.0, sender=ADDR["a"])  # c's batch falls due first
    c.record(to_c, now=0.0, sender=ADDR["a"])
    b.record(to_b, now=0.0, sender=ADDR["a"])
    peers = {n: str(peer_id_of(identity_from_key(KEYS[n]))) for n in "abc"}
    result: list[int] = []

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as a_host,
            running_host(identity_from_key(KEYS["b"])) as b_host,
            running_host(identity_from_key(KEYS["c"])) as c_host,
        ):
            peer_of = {ADDR["b"]: peers["b"], ADDR["c"]: peers["c"]}.get
            worker = BatchCloser(RequestResponse(a_host), a, peer_of)
            b_closer = BatchCloser(RequestResponse(b_host), b, {}.get)
            c_closer = BatchCloser(RequestResponse(c_host), c, {}.get)
            asked_b = trio.Event()

            async def b_serves(peer: str, data: bytes) -> bytes:
                asked_b.set()
                return await b_closer._close(peer, data)

            async def c_waits(peer: str, data: bytes) -> bytes:
                await asked_b.wait()
                return await c_closer._close(peer, data)

            RequestResponse(b_host).serve(CLOSE_PROTOCOL, b_serves, b_closer._limits())
            RequestResponse(c_host).serve(CLOSE_PROTOCOL, c_waits, c_closer._limits())
            for host in (b_host, c_host):
                await a_host.connect(peer_info(full_address(host)))
            with trio.fail_after(30):
                result.append(await worker.close_due(now=0.0, iteration_end=True))

    trio.run(main)
    assert charged == [] and result == [2], (charged, result)


def test_racing_paths_over_one_hop_key_commit_one_receipt(node_url: Callable[[str], str]) -> None:
    """The per-hop and the batched path at once, each with its own version of one hop (a
    lying worker racing them): exactly one version is signed or held, on either database."""
    b = db_book(node_url("b"), "b")
    per_hop = HopStore(b.store.db)
    start = threading.Barrier(2)
    for i in range(8):
        first = receipt(i)
        second = replace(first, outputDigest=keccak(b"other"))
        digest = receipt_digest(second, DOMAIN)
        results: dict[str, object] = {}

        def batched(r: HopReceipt = first, out: dict[str, object] = results) -> None:
            start.wait()
            out["batched"] = b.record([r], now=0.0, sender=ADDR["a"])[0]

        def signed(
            r: HopReceipt = second, d: bytes = digest, out: dict[str, object] = results
        ) -> None:
            start.wait()
            item = ToSign(hop_key(r), r, d, lambda: b"\x01" * 65, b"\x02" * 65)
            out["per_hop"] = not isinstance(per_hop.countersign_once([item])[0], Exception)

        threads = [threading.Thread(target=batched), threading.Thread(target=signed)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True], (i, results)


def test_an_honest_pairs_slowest_batch_settles_within_the_data_nodes_grace(
    tmp_path: Path,
) -> None:
    """The slowest honest schedule: a hop closed on age, its kept neighbour's ack lost, "not
    yet" until given up, the rest closed again and countersigned: all within
    ``settled_within_s``, which a data node's report grace covers (a shorter one is refused)."""
    settings = BatchSettings(max_hops=64, max_age_s=4.0, close_timeout_s=2.0)
    a, b = book(tmp_path, "a", settings), book(tmp_path, "b", settings)
    tick, answer = settings.tick_s, settings.close_timeout_s
    kept = receipt(1)
    a.record([receipt(0)], now=0.0, sender=ADDR["a"])
    a.record([kept], now=0.0, sender=ADDR["a"], kept=frozenset({hop_key(kept)}))
    b.record([receipt(0)], now=0.0, sender=ADDR["a"])
    now = 0.0
    while not a.due(now):  # closed on age, at a tick
        now += tick
    request = a.close(1, 0, ADDR["b"], now)
    assert request is not None
    while a.due(now) == []:  # answered "not yet" at each tick (each at most ``answer`` late)
        now += answer
        with pytest.raises(BatchRefused) as pending:
            b.countersign(request, ADDR["a"])
        lacking = pending.value.lacking  # type: ignore[attr-defined]
        a.answered(request, "peer-b", None, "not yet", True, now, lacking=lacking)
        now += tick
    request = a.close(1, 0, ADDR["b"], now)  # the rest, closed again
    assert request is not None
    now += answer
    assert a.answered(request, "peer-b", b.countersign(request, ADDR["a"]), "", now=now)
    assert now <= settings.settled_within_s
    with pytest.raises(ValueError, match="grace_s"):
        ReceiptsConfig(TERMS, "sqlite://", None, grace_s=10.0, batches=settings)  # type: ignore[arg-type]
    config = ReceiptsConfig(TERMS, "sqlite://", None, batches=settings)  # type: ignore[arg-type]
    assert config.grace_s == grace_for(settings, config.report_period_s)
    assert config.grace_s >= settings.settled_within_s + config.report_period_s


def test_held_receipts_and_unanswered_closes_are_forgotten_two_epochs_on(
    tmp_path: Path,
) -> None:
    """A backward held behind a withheld forward is never released, a dead receiver never
    answers: neither is kept in memory for the whole run. Once the node records a receipt two
    epochs later, those of epochs before the last are dropped, counted."""
    a = book(tmp_path, "a")
    held = receipt(0)
    a.record([held], now=0.0, sender=ADDR["a"], held=frozenset({hop_key(held)}))
    a.record([receipt(1)], now=0.0, sender=ADDR["a"])
    request = a.close(1, 0, ADDR["b"], now=0.0)
    assert request is not None
    assert not a.answered(request, "peer-b", None, "no answer", now=0.0, unreachable=True)
    assert a.pending_requests() == [request] and a._held
    a.record([receipt(2, epoch=1)], now=1.0, sender=ADDR["a"])  # the last epoch: kept
    assert a.pending_requests() == [request] and a.forgotten == 0
    a.record([receipt(3, epoch=2)], now=2.0, sender=ADDR["a"])
    assert a.pending_requests() == [] and not a._held and a.forgotten == 2
    a.release([hop_key(held)], now=3.0)  # too late: stays out of every batch's count
    assert a.due(now=3.0, iteration_end=True) == [(1, 1, ADDR["b"]), (1, 2, ADDR["b"])]


def test_pages_and_reports_read_stored_proofs_and_rebuild_no_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each receipt's proof is stored with its batch: a page of an epoch's receipts (a
    request each) costs its rows, not every batch tree of the epoch built again."""
    a, b = book(tmp_path, "a", BatchSettings(max_hops=8)), book(tmp_path, "b")
    receipts = [receipt(i) for i in range(20)]
    both_record(a, b, receipts)
    for _ in range(3):
        request = a.close(1, 0, ADDR["b"], now=0.0)
        assert request is not None
        assert a.answered(request, "peer-b", b.countersign(request, ADDR["a"]), "")
    expected = sorted(
        (e for c in a.sealed(1, 0) for e in c.sealed(DOMAIN) if c.batch.worker == ADDR["a"]),
        key=lambda e: hop_key(e.receipt),
    )
    assert len(expected) == 20

    def rebuilt(*_: object) -> None:
        raise AssertionError("a batch's tree built again to serve a page")

    monkeypatch.setattr("gwtf.node.store.batches.build_tree", rebuilt)
    monkeypatch.setattr("gwtf.node.store.batches.batch_of", rebuilt)
    for store, role in ((a.store, WORKER), (b.store, RECEIVER)):
        assert store.sealed(1, 0, role) == expected
        assert store.page(role, 1, 0, 5, 10) == (20, expected[5:15])
        assert store.page(role, 1, 0, 18, 10) == (20, expected[18:])
    assert b.store.page(WORKER, 1, 0, 0, 10) == (0, [])


def test_a_close_racing_the_record_of_a_held_receipt_never_signs_it(tmp_path: Path) -> None:
    """A held receipt (a send not acked yet, a backward behind its forward) is held from the
    transaction that records it: a close run by another thread right after that commit, before
    the recording thread goes on, reads it held and leaves it out of the batch."""
    a = book(tmp_path, "a")
    assert all(a.record([receipt(i) for i in range(3)], now=0.0, sender=ADDR["a"]))
    backward = receipt(9)
    committed, go = threading.Event(), threading.Event()
    real = a.store.record

    def record(*args: object, **kw: object) -> list[bool]:  # descheduled after its commit
        result = real(*args, **kw)  # type: ignore[arg-type]
        committed.set()
        go.wait(10)
        return result

    a.store.record = record  # type: ignore[method-assign]
    writer = threading.Thread(
        target=a.record, args=([backward], 1.0, ADDR["a"], frozenset({hop_key(backward)}))
    )
    writer.start()
    try:
        assert committed.wait(10)
        request = a.close(1, 0, ADDR["b"], 2.0)  # in the window
    finally:
        go.set()
        writer.join(10)
    assert request is not None and len(request.hop_keys) == 3
    assert hop_key(backward) not in request.hop_keys
    assert a.close(1, 0, ADDR["b"], 3.0) is None  # still held


def test_a_receiver_withholding_again_is_stopped_for_twice_as_many_iterations(
    tmp_path: Path,
) -> None:
    """A refusal stops its receiver for the rest of the iteration; refusing again before it
    settled cleanly, for 2, then 4 iterations (so a receiver refusing whenever it is sent hops
    costs its worker ever fewer batches); an iteration in which it countersigned and withheld
    nothing takes one strike off."""
    charged: list[str] = []
    a = book(tmp_path, "a", withholders=Withholders(lambda peer, why: charged.append(peer)))
    b = book(tmp_path, "b")
    w = a.withholders
    epoch = [0]

    def batch_to_b() -> CloseRequest:
        epoch[0] += 1
        both_record(a, b, [receipt(i, epoch=epoch[0]) for i in range(3)])
        request = a.close(1, epoch[0], ADDR["b"], now=0.0)
        assert request is not None
        return request

    def stopped_for() -> int:
        """Iterations, the current one included, it is sent no hops."""
        n = 0
        while not w.may_send("peer-b"):
            w.new_iteration()
            n += 1
        return n

    for expected in (1, 2, 4):
        assert not a.answered(batch_to_b(), "peer-b", None, "refused: no")
        assert stopped_for() == expected
    assert charged == ["peer-b"] * 3
    request = batch_to_b()  # settles cleanly for one iteration: one strike off
    assert a.answered(request, "peer-b", b.countersign(request, ADDR["a"]), "")
    w.new_iteration()
    assert not a.answered(batch_to_b(), "peer-b", None, "refused: no")
    assert stopped_for() == 4  # the third strike again, not the fourth (8)
    # Two refusals in one stop charge it once.
    first, second = batch_to_b(), batch_to_b()
    assert not a.answered(first, "peer-b", None, "refused: no")
    assert not a.answered(second, "peer-b", None, "refused: no")
    assert charged == ["peer-b"] * 5


def test_a_receiver_with_two_batches_awaiting_its_countersignature_is_sent_no_hops(
    tmp_path: Path,
) -> None:
    """Hops to a receiver stop while more than one batch awaits its countersignature (answered
    "not yet" or not at all): what it can leave unpaid is bounded by two batches, not by how
    long it keeps answering "not yet". Its closes are still sent again."""
    a, b = book(tmp_path, "a"), book(tmp_path, "b")
    requests = []
    for epoch in range(2):
        a.record([receipt(i, epoch=epoch) for i in range(3)], now=0.0, sender=ADDR["a"])
        request = a.close(1, epoch, ADDR["b"], now=0.0)
        assert request is not None
        requests.append(request)
    lacking = requests[0].hop_keys[:1]
    assert not a.answered(requests[0], "peer-b", None, "not yet", True, 0.0, False, lacking)
    assert a.withholders.may_send("peer-b")  # one awaiting
    assert not a.answered(requests[1], "peer-b", None, "no answer", now=0.0, unreachable=True)
    a.withholders.new_iteration()  # no longer stopped for the timeout, still two awaiting
    assert not a.withholders.may_send("peer-b") and a.withholders.may_close("peer-b")
    assert a.withholders.may_send("peer-c")
    b.record([receipt(i, epoch=1) for i in range(3)], now=0.0, sender=ADDR["a"])
    answer = b.countersign(requests[1], ADDR["a"])
    assert a.answered(requests[1], "peer-b", answer, "")
    assert a.withholders.may_send("peer-b")


def made_up_close(n: int, salt: int) -> CloseRequest:
    """A close signed by run member ``c`` naming ``n`` hop keys nobody holds."""
    keys = tuple(sorted(keccak(bytes([salt]) + i.to_bytes(4, "big")) for i in range(n)))
    batch = HopBatch(1, 0, ADDR["c"], ADDR["b"], keccak(b"any root"))
    return CloseRequest(batch, sign_digest(batch.digest(DOMAIN), KEYS["c"]), keys)


def test_a_close_naming_hops_never_held_costs_one_chunks_read_and_names_at_most_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver reads a close's hops in hop key order a chunk at a time and stops at the
    first chunk lacking one: 4096 made-up keys cost it one chunk's read, and its "not yet"
    names that chunk's keys only; a batch of one chunk has all its lacking hops named."""
    b = book(tmp_path, "b")
    read: list[int] = []
    real = b.store._hops._rows_of

    def rows_of(connection: object, table: object, columns: str, keys: list[bytes]) -> object:
        read.append(len(keys))
        return real(connection, table, columns, keys)  # type: ignore[arg-type]

    monkeypatch.setattr(b.store._hops, "_rows_of", rows_of)
    request = made_up_close(MAX_BATCH_HOPS, 0)
    with pytest.raises(BatchPending) as pending:
        b.countersign(request, ADDR["c"])
    assert read == [CHUNK] and pending.value.lacking == request.hop_keys[:CHUNK]
    small = made_up_close(300, 1)
    with pytest.raises(BatchPending) as pending:
        b.countersign(small, ADDR["c"])
    assert pending.value.lacking == small.hop_keys


def test_a_workers_not_yet_answers_are_bounded_per_window_then_its_closes_declined(
    tmp_path: Path,
) -> None:
    """A run member sending closes of made-up hops gets ``MAX_NOT_YET`` "not yet" answers per
    ``max_age_s``; its further closes are declined unread (uncharged: an honest worker sends
    them again later) until the window ends. Another worker is answered as before."""
    b = book(tmp_path, "b", BatchSettings(max_age_s=0.5))
    closer = BatchCloser(None, b, {}.get)  # type: ignore[arg-type]
    peer_c = str(peer_id_of(identity_from_key(KEYS["c"])))
    request = made_up_close(4, 2).encode()

    async def flood() -> list[bytes | str]:
        answers: list[bytes | str] = []
        for _ in range(MAX_NOT_YET + 2):
            try:
                answers.append((await closer._close(peer_c, request))[:1])
            except Decline as exc:
                answers.append(str(exc))
        return answers

    answers = trio.run(flood)
    assert answers[:MAX_NOT_YET] == [b"\x02"] * MAX_NOT_YET
    assert all(isinstance(a, str) and "not yet" in a for a in answers[MAX_NOT_YET:])
    assert closer.throttled == 2 and closer.refused == 0
    time.sleep(0.5)
    assert trio.run(flood)[0] == b"\x02"  # a new window


def test_a_close_lacking_a_few_hops_in_each_chunk_names_them_all(tmp_path: Path) -> None:
    """A batch of more than a chunk's hops whose receiver lacks a few in two chunks (kept
    outputs' receipts whose acks were lost) is read whole: the "not yet" names both, so the
    worker gives it up once, not once per chunk."""
    b = book(tmp_path, "b")
    held = [receipt(i % 256, epoch=i // 256) for i in range(1500)]
    for start in range(0, len(held), 500):
        assert all(b.record(held[start : start + 500], now=0.0, sender=ADDR["a"]))
    keys = sorted(hop_key(r) for r in held)
    lost = [
        keys[100][:-1] + bytes([keys[100][-1] ^ 1]),
        keys[1200][:-1] + bytes([keys[1200][-1] ^ 1]),
    ]
    named = tuple(sorted([*keys, *lost]))
    batch = HopBatch(1, 0, ADDR["a"], ADDR["b"], keccak(b"any root"))
    request = CloseRequest(batch, sign_digest(batch.digest(DOMAIN), KEYS["a"]), named)
    with pytest.raises(BatchPending) as pending:
        b.countersign(request, ADDR["a"])
    assert pending.value.lacking == tuple(sorted(lost))

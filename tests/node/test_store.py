"""The node database on SQLite and on a real PostgreSQL server: the migrations create exactly the
models (``alembic check``) and come back down, a node never signs two receipts for one hop key
(restarts and SIGKILLs included), and every write is idempotent.

PostgreSQL comes from ``GWTF_TEST_POSTGRES_URL`` (``.ci/run`` starts Debian's server and sets
it); without it the PostgreSQL cases are skipped, saying why, except in CI, where they fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from alembic import command
from eth_account import Account
from eth_utils.crypto import keccak
from sqlalchemy import BigInteger, LargeBinary, String, create_engine, inspect, make_url, text

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    HOP_RECEIPT_FIELDS,
    HopReceipt,
    hop_key,
    ledger_domain,
    receipt_digest,
    scheduled_units,
    sign_digest,
    sign_receipt,
)
from gwtf.node.store.database import (
    Database,
    DatabaseError,
    alembic_config,
    create_store_engine,
    open_database,
)
from gwtf.node.store.hops import ConflictingReceipt, HopStore, ToSign
from gwtf.node.store.models import (
    RECEIPT_COLUMNS,
    BatchedReceipt,
    CertifiedHopRow,
    ReceiptFields,
    ReceivedHop,
    ReportedHop,
    SignedHop,
    receipt_columns,
    receipt_of,
)

POSTGRES_URL = os.environ.get("GWTF_TEST_POSTGRES_URL", "")
DOMAIN = ledger_domain(1, "0x" + "ab" * 20)
# Fixed keys: the SIGKILL test's subprocess imports this module and must sign with the same one.
WORKER, RECEIVER = (Account.from_key(keccak(text=f"store test {who}")) for who in ("a", "b"))
TABLES = {
    "signed_hops", "countersignatures", "certified_hops", "epoch_certificates",
    "reward_claims", "slashes", "challenges_seen", "peers", "reported_hops", "origin_digests",
    "received_hops", "hop_proofs", "batched_receipts", "hop_batches", "hop_commitments",
}  # fmt: skip
RECEIPT_TABLES = (SignedHop, ReceivedHop, CertifiedHopRow, ReportedHop, BatchedReceipt)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """GWTF_TEST_POSTGRES_URL, or under pytest-xdist a database of this worker's own beside it
    (``gwtf_test_gw0``), created when missing: each test migrates and drops its schema, which
    two workers must not do in one database under each other."""
    if not POSTGRES_URL:
        if os.environ.get("CI"):
            pytest.fail("CI must run the PostgreSQL cases: set GWTF_TEST_POSTGRES_URL")
        pytest.skip("no PostgreSQL server: set GWTF_TEST_POSTGRES_URL (.ci/run starts one)")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return POSTGRES_URL
    base = make_url(POSTGRES_URL)
    own = base.set(database=f"{base.database}_{worker}")
    engine = create_engine(base, isolation_level="AUTOCOMMIT")  # CREATE DATABASE needs it
    try:
        with engine.connect() as connection:
            exists = connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": own.database}
            ).scalar()
            if not exists:
                connection.execute(text(f'CREATE DATABASE "{own.database}"'))
    finally:
        engine.dispose()
    return own.render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'node.sqlite'}"
        return
    postgres: str = request.getfixturevalue("postgres_url")
    db = open_database(postgres)
    try:
        yield postgres
    finally:
        # Each test starts from an empty schema: drop everything the migrations made.
        with db.engine.begin() as connection:
            command.downgrade(alembic_config(postgres, connection), "base")
            connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
        db.close()


@pytest.fixture
def store(url: str) -> Iterator[HopStore]:
    db = open_database(url)
    try:
        yield HopStore(db)
    finally:
        db.close()


def receipt(microbatch: int, output: bytes = b"\x02" * 32) -> HopReceipt:
    return HopReceipt(
        runId=1, epoch=0, dataNode="0x" + "cd" * 20, iteration=microbatch // 4,
        microbatchId=microbatch, stage=1, direction=0, attempt=0, worker=WORKER.address,
        counterparty=RECEIVER.address, inputDigest=b"\x01" * 32, outputDigest=output,
        units=scheduled_units(0, 10),
    )  # fmt: skip


def to_sign(r: HopReceipt, key: bytes = WORKER.key, calls: list[int] | None = None) -> ToSign:
    digest = receipt_digest(r, DOMAIN)

    def sign() -> bytes:
        if calls is not None:
            calls.append(1)
        return sign_receipt(r, DOMAIN, key)

    return ToSign(hop_key(r), r, digest, sign)


def test_the_migrations_create_the_models_and_come_back_down(url: str) -> None:
    db = open_database(url)
    try:
        assert set(inspect(db.engine).get_table_names()) >= TABLES
        command.check(alembic_config(url))  # raises when the models and migrations differ
        with db.engine.begin() as connection:
            command.downgrade(alembic_config(url, connection), "base")
        assert not TABLES & set(inspect(db.engine).get_table_names())
        with db.engine.begin() as connection:
            command.upgrade(alembic_config(url, connection), "head")
        assert set(inspect(db.engine).get_table_names()) >= TABLES
    finally:
        db.close()


@pytest.mark.parametrize("table", RECEIPT_TABLES, ids=lambda t: t.__tablename__)
def test_a_receipt_table_holds_every_receipt_field_in_a_column_of_its_type(
    table: type[SignedHop],
) -> None:
    columns = {c.name: c.type for c in table.__table__.columns}
    abi_of = {RECEIPT_COLUMNS[name]: abi for name, abi in HOP_RECEIPT_FIELDS}
    # The mixin declares exactly the receipt's fields, in struct order; the rest of a row is
    # its hop key, digests, signatures and time.
    assert list(ReceiptFields.__annotations__) == list(abi_of)
    assert set(abi_of) <= set(columns)
    for column, abi in abi_of.items():
        kind = columns[column]
        if abi == "address":
            assert isinstance(kind, String) and kind.length == 42, column
        elif abi == "bytes32":
            assert isinstance(kind, LargeBinary) and kind.length == 32, column
        else:
            assert isinstance(kind, BigInteger), column
    r = receipt(7)
    assert receipt_of(table(**receipt_columns(r))) == r


def test_a_hop_key_is_signed_once_and_a_second_version_is_refused(store: HopStore) -> None:
    calls: list[int] = []
    first = store.sign_once([to_sign(receipt(1), calls=calls), to_sign(receipt(1), calls=calls)])
    assert isinstance(first[0], bytes) and first[0] == first[1] and len(calls) == 1
    again = store.sign_once([to_sign(receipt(1), calls=calls), to_sign(receipt(1, b"\x09" * 32))])
    assert again[0] == first[0] and len(calls) == 1, "the held signature, not a new one"
    assert isinstance(again[1], ConflictingReceipt)
    # Countersignatures are the receiver's own: the same key may be countersigned once too,
    # and the receiver keeps the whole receipt, its worker's signature with its own.
    worker_signature = first[0]
    assert isinstance(worker_signature, bytes)
    received = replace(to_sign(receipt(1), RECEIVER.key), worker_signature=worker_signature)
    counter = store.countersign_once([received])
    assert isinstance(counter[0], bytes) and counter[0] != worker_signature
    assert store.received_hops(1, 0) == [SignedReceipt(receipt(1), worker_signature, counter[0])]
    other = replace(to_sign(receipt(1, b"\x07" * 32), RECEIVER.key), worker_signature=b"\x01" * 65)
    conflict = store.countersign_once([other])
    assert isinstance(conflict[0], ConflictingReceipt)
    assert len(store.received_hops(1, 0)) == 1


def test_complete_receipts_and_certified_hops_round_trip(store: HopStore) -> None:
    receipts = [receipt(m) for m in range(5)]
    countersigned = [sign_receipt(r, DOMAIN, RECEIVER.key) for r in receipts]
    # A worker signs a hop before sending it, and keeps the countersignature its ack brought;
    # the last two were never acknowledged: they are not complete.
    signatures = store.sign_once([to_sign(r) for r in receipts])
    assert store.signed_hops(1, 0) == []
    keys = [hop_key(r) for r in receipts[:3]]
    store.add_countersignatures(list(zip(keys, countersigned[:3], strict=True)))
    store.add_countersignatures([(keys[0], countersigned[4])])  # a kept one is not replaced
    complete = store.signed_hops(1, 0)
    assert {e.receipt for e in complete} == set(receipts[:3])
    entries = [
        SignedReceipt(r, s, c)  # type: ignore[arg-type]
        for r, s, c in zip(receipts, signatures, countersigned, strict=True)
    ]
    rows = [(hop_key(e.receipt), receipt_digest(e.receipt, DOMAIN), e) for e in entries]
    store.certify(rows)
    store.certify(rows)  # again: nothing changes
    assert sorted(store.certified_hops(1, 0), key=lambda e: e.receipt.microbatchId) == entries
    assert store.certified_hops(1, 1) == []


def test_a_batch_of_twenty_thousand_receipts_is_one_transaction(store: HopStore) -> None:
    signature = sign_digest(b"\x01" * 32, WORKER.key)
    batch = [ToSign(hop_key(r), r, receipt_digest(r, DOMAIN), lambda: signature)
             for r in (receipt(m) for m in range(20_000))]  # fmt: skip
    assert all(s == signature for s in store.sign_once(batch))
    assert len(store.sign_once(batch[:10])) == 10


SIGN_AND_DIE = """
import os, signal, sys
from tests.node.test_store import to_sign, receipt
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore
store = HopStore(open_database(sys.argv[1]))
(signature,) = store.sign_once([to_sign(receipt(42))])
sys.stdout.write(signature.hex()); sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown: the commit must have been enough
"""


def test_a_signature_handed_out_survives_a_sigkill_and_binds_the_restarted_node(
    url: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SIGN_AND_DIE, url], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    handed_out = bytes.fromhex(done.stdout)
    db: Database = open_database(url)
    try:
        restarted = HopStore(db)
        assert restarted.sign_once([to_sign(receipt(42))]) == [handed_out]
        (refused,) = restarted.sign_once([to_sign(receipt(42, b"\x05" * 32))])
        assert isinstance(refused, ConflictingReceipt)
    finally:
        db.close()


def test_writes_that_arrive_during_a_commit_share_the_next_one() -> None:
    import time

    import trio

    from gwtf.node.store.writer import BatchWriter

    batches: list[int] = []

    def write(batch: object) -> list[int]:
        items = list(batch)  # type: ignore[call-overload]
        batches.append(len(items))
        time.sleep(0.05)  # a slow commit: everyone arriving meanwhile waits for the next one
        return [item * 2 for item in items]

    writer: BatchWriter[int, int] = BatchWriter(write)
    answers: dict[int, int] = {}

    async def caller(item: int) -> None:
        answers[item] = await writer.submit(item)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(caller, 0)
            await trio.sleep(0.01)  # the first commit is under way
            async with trio.open_nursery() as callers:
                for item in range(1, 100):
                    callers.start_soon(caller, item)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert answers == {item: 2 * item for item in range(100)}
    assert batches == [1, 99]


def test_a_reader_changes_nothing_and_says_when_the_node_must_migrate_first(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'node.sqlite'}"
    with pytest.raises(DatabaseError, match=r"at schema none, .* start the node once"):
        open_database(url, migrate=False)
    assert not inspect(create_store_engine(url)).get_table_names()  # no schema was made
    open_database(url).close()
    open_database(url, migrate=False).close()  # migrated by its node: readable

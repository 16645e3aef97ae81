"""Where a node's receipts are kept: the hops it signed and countersigned, the hops it certified.

The rule that keeps an honest node from ever being slashed lives here: a node signs (as worker)
and countersigns (as receiver) at most one receipt per hop key, for ever, restarts included. So
a signature is handed out only after the receipt it signs is committed under its hop key, and a
second, different receipt for a key already held is refused (``ConflictingReceipt``). A
receiver commits the whole receipt, its worker's signature with its own, before it acks: the
work a countersignature vouches for is on disk before anyone can rely on it. Writes are
batched: each call takes a whole batch in one transaction, and the callers gather batches off
the trio loop (``gwtf.node.store.writer``). Every write is idempotent: the same receipt again
changes nothing and returns the same signature.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt
from gwtf.contracts.encoding import HopReceipt, signatures_hash
from gwtf.errors import GwtfError
from gwtf.node.failpoints import failpoint
from gwtf.node.store.database import Database
from gwtf.node.store.models import (
    Base,
    CertifiedHopRow,
    Countersignature,
    HopCommitment,
    OriginDigest,
    ReceivedHop,
    ReportedHop,
    SignedHop,
    receipt_columns,
    receipt_of,
)

# Rows per statement: SQLite binds at most 32,766 parameters, a hop row has 18.
CHUNK = 1_000


class ConflictingReceipt(GwtfError):
    """A different receipt for a hop key this node already signed: signing it would be
    equivocation, so it is refused."""

    exit_code = 5


@dataclass(frozen=True)
class ToSign:
    """A receipt to sign under ``hop_key``: ``sign`` makes the signature, called only for a key
    this node holds no receipt of yet. A receiver countersigning keeps the worker's
    ``worker_signature`` with its own."""

    hop_key: bytes
    receipt: HopReceipt
    receipt_digest: bytes
    sign: Callable[[], bytes]
    worker_signature: bytes | None = None


def hop_row(
    key: bytes,
    digest: bytes,
    receipt: HopReceipt,
    worker_signature: bytes,
    counterparty_signature: bytes | None,
    **others: object,
) -> dict[str, object]:
    """A row of a receipt table (``ReceiptFields``): a receipt under its hop key and digest,
    with its signatures and the table's ``others``."""
    return {
        "hop_key": key, "receipt_digest": digest, "worker_signature": worker_signature,
        "counterparty_signature": counterparty_signature, **receipt_columns(receipt), **others,
    }  # fmt: skip


def signed_receipt_of(
    row: SignedHop | ReceivedHop | CertifiedHopRow | ReportedHop,
) -> SignedReceipt:
    """The receipt a row holds with its signatures (a signed hop's, once countersigned) and,
    of a reported or certified one, its proof in its batch."""
    proof = getattr(row, "batch_proof", None) or b""
    return SignedReceipt(
        receipt_of(row),
        row.worker_signature,
        row.counterparty_signature or b"",
        tuple(proof[i : i + 32] for i in range(0, len(proof), 32)),
    )


class HopStore:
    """The receipts of one node, in its database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ as worker
    def sign_once(self, batch: Sequence[ToSign]) -> list[bytes | ConflictingReceipt]:
        """Sign each receipt as worker, at most one per hop key: the signature of a receipt
        already held is returned again, a different receipt for a held key is refused."""
        return self._sign_once(SignedHop, batch, self._signed_row)

    def add_countersignatures(self, batch: Sequence[tuple[bytes, bytes]]) -> list[None]:
        """Complete signed hops with their receivers' countersignatures: (hop key, signature)."""
        sql = (
            f"UPDATE signed_hops SET counterparty_signature = {self._mark} "
            f"WHERE hop_key = {self._mark} AND counterparty_signature IS NULL"
        )
        with self.db.engine.begin() as connection:
            self._executemany(connection, sql, [(counter, key) for key, counter in batch])
        return [None] * len(batch)

    def signed_hops(self, run_id: int, epoch: int) -> list[SignedReceipt]:
        """The complete receipts of hops this node did in an epoch (countersigned ones)."""
        with self.db.sessions() as session:
            rows = session.scalars(
                select(SignedHop).where(
                    SignedHop.run_id == run_id,
                    SignedHop.epoch == epoch,
                    SignedHop.counterparty_signature.is_not(None),
                )
            )
            return [signed_receipt_of(r) for r in rows]

    # ------------------------------------------------------------ as counterparty
    def countersign_once(self, batch: Sequence[ToSign]) -> list[bytes | ConflictingReceipt]:
        """Countersign each receipt, at most one per hop key (see ``sign_once``), and keep it
        whole with its worker's signature (``received_hops``) in the same transaction."""
        return self._sign_once(
            Countersignature, batch, self._countersigned_row, (ReceivedHop, self._received_row)
        )

    def received_hops(self, run_id: int, epoch: int) -> list[SignedReceipt]:
        """The whole receipts of hops this node countersigned in an epoch."""
        with self.db.sessions() as session:
            rows = session.scalars(
                select(ReceivedHop).where(ReceivedHop.run_id == run_id, ReceivedHop.epoch == epoch)
            )
            return [signed_receipt_of(r) for r in rows]

    def signed_epochs(self, run_id: int) -> list[tuple[int, str]]:
        """(epoch, data node) pairs of which this node signed receipts: complete or not here,
        their receivers hold them whole and may have reported them."""
        with self.db.sessions() as session:
            rows = session.execute(
                select(SignedHop.epoch, SignedHop.data_node)
                .where(SignedHop.run_id == run_id)
                .distinct()
            )
            return sorted((epoch, data_node) for epoch, data_node in rows)

    # ------------------------------------------------------------ served to peers
    def page(
        self,
        table: type[SignedHop] | type[ReceivedHop],
        run_id: int,
        epoch: int,
        offset: int,
        limit: int,
    ) -> tuple[int, list[SignedReceipt]]:
        """(how many, ``limit`` from ``offset``) of the complete receipts of an epoch this node
        signed (``SignedHop``) or countersigned (``ReceivedHop``), in hop key order."""
        where = [table.run_id == run_id, table.epoch == epoch]
        if table is SignedHop:
            where.append(SignedHop.counterparty_signature.is_not(None))
        with self.db.sessions() as session:
            total = session.scalar(select(func.count()).select_from(table).where(*where)) or 0
            query = select(table).where(*where).order_by(table.hop_key)
            rows: list[SignedHop | ReceivedHop] = list(
                session.scalars(query.offset(offset).limit(limit))
            )
            return total, [signed_receipt_of(r) for r in rows]

    # ------------------------------------------------------------ as data node
    def add_reported(self, prepared: Sequence[PreparedHop]) -> None:
        """Keep receipts workers reported, checked and prepared; again is a no-op."""
        now = time.time()
        rows = [
            hop_row(
                p.hop_key, p.receipt_digest, p.entry.receipt, p.entry.worker_signature,
                p.entry.counterparty_signature, signatures_hash=p.signatures_hash,
                reported_at=now, batch_proof=_joined(p.entry.proof),
            )
            for p in prepared
        ]  # fmt: skip
        with self.db.engine.begin() as connection:
            self._insert_new(connection, ReportedHop, _unique_by_key(rows))

    def reported_hashes(self, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes, bytes]]:
        """(receipt digest, signatures hash) of the receipts under ``keys`` this data node
        holds whole and checked: reported to it, or countersigned by it (``received_hops``: it
        checked the worker's signature then, and the worker reports the receipt too)."""
        keys = list(keys)
        with self.db.engine.begin() as connection:
            held = self._held(connection, ReportedHop, keys)
            rest = [key for key in keys if key not in held]
            columns = "hop_key, receipt_digest, worker_signature, counterparty_signature"
            for key, digest, worker, counter in self._rows_of(
                connection, ReceivedHop, columns, rest
            ):
                held[bytes(key)] = (bytes(digest), signatures_hash(bytes(worker), bytes(counter)))
        return held

    def reported_hops(self, run_id: int, epoch: int) -> list[PreparedHop]:
        """Every receipt reported to this data node for an epoch, as prepared when it came."""
        with self.db.sessions() as session:
            rows = session.scalars(
                select(ReportedHop).where(ReportedHop.run_id == run_id, ReportedHop.epoch == epoch)
            )
            return [
                PreparedHop(
                    signed_receipt_of(r),
                    r.hop_key,
                    r.receipt_digest,
                    r.signatures_hash,
                )
                for r in rows
            ]

    def add_anchors(self, anchors: Sequence[dict[str, object]]) -> None:
        """Keep the frames this data node started chains with (``OriginDigest`` columns)."""
        unique = list({tuple(a.values()): a for a in anchors}.values())
        with self.db.engine.begin() as connection:
            self._insert_new(connection, OriginDigest, unique)

    def anchors(self, run_id: int, epoch: int) -> list[OriginDigest]:
        with self.db.sessions() as session:
            return list(
                session.scalars(
                    select(OriginDigest).where(
                        OriginDigest.run_id == run_id, OriginDigest.epoch == epoch
                    )
                )
            )

    def certify(self, entries: Sequence[tuple[bytes, bytes, SignedReceipt]]) -> None:
        """Record certified hops: (hop key, receipt digest, signed receipt); again is a no-op."""
        with self.db.engine.begin() as connection:
            self._insert_new(connection, CertifiedHopRow, _certified_rows(entries))

    def replace_certified(
        self, run_id: int, epoch: int, entries: Sequence[tuple[bytes, bytes, SignedReceipt]]
    ) -> None:
        """Make ``entries`` the epoch's certified hops, in one transaction: a certificate built
        again after a crash before its submission replaces the one that never reached the
        chain."""
        with self.db.engine.begin() as connection:
            connection.execute(
                delete(CertifiedHopRow).where(
                    CertifiedHopRow.run_id == run_id, CertifiedHopRow.epoch == epoch
                )
            )
            self._insert_new(connection, CertifiedHopRow, _certified_rows(entries))

    def certified_hops(self, run_id: int, epoch: int) -> list[SignedReceipt]:
        """Every hop this data node certified for an epoch."""
        with self.db.sessions() as session:
            rows = session.scalars(
                select(CertifiedHopRow).where(
                    CertifiedHopRow.run_id == run_id, CertifiedHopRow.epoch == epoch
                )
            )
            return [signed_receipt_of(r) for r in rows]

    # ------------------------------------------------------------ internals
    @staticmethod
    def _signed_row(item: ToSign, signature: bytes, now: float) -> dict[str, object]:
        return hop_row(
            item.hop_key, item.receipt_digest, item.receipt, signature, None, signed_at=now
        )

    @staticmethod
    def _countersigned_row(item: ToSign, signature: bytes, now: float) -> dict[str, object]:
        return {
            "hop_key": item.hop_key, "receipt_digest": item.receipt_digest,
            "signature": signature, "run_id": item.receipt.runId, "epoch": item.receipt.epoch,
            "signed_at": now,
        }  # fmt: skip

    @staticmethod
    def _received_row(item: ToSign, signature: bytes, now: float) -> dict[str, object]:
        assert item.worker_signature is not None, "a receiver keeps its worker's signature"
        return hop_row(
            item.hop_key,
            item.receipt_digest,
            item.receipt,
            item.worker_signature,
            signature,
            received_at=now,
        )

    def _sign_once(
        self,
        table: type[SignedHop] | type[Countersignature],
        batch: Sequence[ToSign],
        row_of: Callable[[ToSign, bytes, float], dict[str, object]],
        also: tuple[type[Base], Callable[[ToSign, bytes, float], dict[str, object]]] | None = None,
    ) -> list[bytes | ConflictingReceipt]:
        now = time.time()
        keys = [item.hop_key for item in batch]
        with self.db.engine.begin() as connection:
            committed = self.commit_once(
                connection, [(item.hop_key, item.receipt_digest) for item in batch]
            )
            held = self._held(connection, table, keys)
            results: list[bytes | ConflictingReceipt] = []
            fresh: dict[bytes, tuple[bytes, bytes]] = {}
            for item in batch:
                known = held.get(item.hop_key) or fresh.get(item.hop_key)
                if committed[item.hop_key] != item.receipt_digest:
                    known = (committed[item.hop_key], b"")  # committed elsewhere (a batch)
                if known is None:
                    signature = item.sign()
                    fresh[item.hop_key] = (item.receipt_digest, signature)
                    results.append(signature)
                elif known[0] == item.receipt_digest:
                    results.append(known[1])
                else:
                    results.append(
                        ConflictingReceipt(
                            f"hop {item.hop_key.hex()} was signed with another receipt; "
                            "refusing to sign a second version"
                        )
                    )
            signed = [
                (item, fresh[item.hop_key][1])
                for item in batch
                if item.hop_key in fresh and fresh[item.hop_key][0] == item.receipt_digest
            ]
            rows = [row_of(item, signature, now) for item, signature in signed]
            self._insert_new(connection, table, _unique_by_key(rows))
            failpoint("store.mid_batch")
            if also is not None:
                other, other_row = also
                rows = [other_row(item, signature, now) for item, signature in signed]
                self._insert_new(connection, other, _unique_by_key(rows))
        return results

    def commit_once(
        self, connection: Connection, pairs: Sequence[tuple[bytes, bytes]]
    ) -> dict[bytes, bytes]:
        """Commit this node to one receipt digest per hop key, in ``connection``'s transaction:
        (hop key, digest) pairs are inserted where the key is new (the first of a key wins) and
        every key's committed digest is read back. Every path that signs a receipt, per hop or
        in a batch, goes through here first, so no two ever sign two versions of one hop (the
        insert waits on a concurrent one of the same key, on SQLite and PostgreSQL alike)."""
        first: dict[bytes, bytes] = {}
        for key, digest in pairs:
            first.setdefault(key, digest)
        rows: list[dict[str, object]] = [
            {"hop_key": key, "receipt_digest": digest} for key, digest in first.items()
        ]
        self._insert_new(connection, HopCommitment, rows)
        keys = [key for key, _ in pairs]
        return {
            bytes(key): bytes(digest)
            for key, digest in self._rows_of(
                connection, HopCommitment, "hop_key, receipt_digest", keys
            )
        }

    def _held(
        self,
        connection: Connection,
        table: type[SignedHop] | type[Countersignature] | type[ReportedHop],
        keys: list[bytes],
    ) -> dict[bytes, tuple[bytes, bytes]]:
        """(receipt digest, signature) under each held key; of a reported hop, the hash of
        its signatures."""
        held: dict[bytes, tuple[bytes, bytes]] = {}
        signature = {
            SignedHop: "worker_signature", Countersignature: "signature",
            ReportedHop: "signatures_hash",
        }[table]  # fmt: skip
        columns = f"hop_key, receipt_digest, {signature}"
        for key, digest, signed in self._rows_of(connection, table, columns, keys):
            held[bytes(key)] = (bytes(digest), bytes(signed))
        return held

    def _rows_of(
        self, connection: Connection, table: type[Base], columns: str, keys: Sequence[bytes]
    ) -> list[tuple[Any, ...]]:
        """``columns`` of ``table``'s rows under ``keys``, asked ``CHUNK`` keys at a time on
        the raw connection, as this store's other batch reads and writes are."""
        rows: list[tuple[Any, ...]] = []
        with closing(connection.connection.cursor()) as cursor:
            for start in range(0, len(keys), CHUNK):
                chunk = keys[start : start + CHUNK]
                marks = ", ".join([self._mark] * len(chunk))
                cursor.execute(
                    f"SELECT {columns} FROM {table.__tablename__} WHERE hop_key IN ({marks})",
                    chunk,
                )
                rows.extend(cursor.fetchall())
        return rows

    def _insert_new(
        self, connection: Connection, table: type[Base], rows: Sequence[dict[str, object]]
    ) -> None:
        """Insert rows whose primary key is new; rows already there are left as they are."""
        if not rows:
            return
        columns = list(rows[0])
        marks = ", ".join([self._mark] * len(columns))
        sql = (
            f"INSERT INTO {table.__tablename__} ({', '.join(columns)}) VALUES ({marks}) "
            "ON CONFLICT DO NOTHING"
        )
        self._executemany(connection, sql, [tuple(row[c] for c in columns) for row in rows])

    @property
    def _mark(self) -> str:
        return "%s" if self.db.engine.dialect.name == "postgresql" else "?"

    @staticmethod
    def _executemany(connection: Connection, sql: str, rows: list[tuple[object, ...]]) -> None:
        # The driver's own executemany on the connection, inside its transaction: a
        # receipt row is 18 values, and SQLAlchemy's per-value processing would cost several
        # times the write itself (a relay writes every hop's receipt twice).
        with closing(connection.connection.cursor()) as cursor:
            cursor.executemany(sql, rows)


def _certified_rows(
    entries: Sequence[tuple[bytes, bytes, SignedReceipt]],
) -> list[dict[str, object]]:
    now = time.time()
    return [
        hop_row(
            key,
            digest,
            e.receipt,
            e.worker_signature,
            e.counterparty_signature,
            certified_at=now,
            batch_proof=_joined(e.proof),
        )
        for key, digest, e in entries
    ]


def _joined(proof: Sequence[bytes]) -> bytes | None:
    """A receipt's proof in its batch as a column: null for a batch of one."""
    return b"".join(proof) or None


def _unique_by_key(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    seen: dict[object, dict[str, object]] = {}
    for row in rows:
        seen.setdefault(row["hop_key"], row)
    return list(seen.values())

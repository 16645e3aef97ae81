"""Where a node's receipts are kept: the hops it signed and countersigned, the hops it certified.

The rule that keeps an honest node from ever being slashed lives here: a node signs (as worker)
and countersigns (as receiver) at most one receipt per hop key, for ever, restarts included. So
a signature is handed out only after the receipt it signs is committed under its hop key, and a
second, different receipt for a key already held is refused (``ConflictingReceipt``). Writes are
batched: each call takes a whole batch in one transaction, and the callers gather batches off
the trio loop (``node.store.writer``). Every write is idempotent: the same receipt again changes
nothing and returns the same signature.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from contracts.certificate_tree import SignedReceipt
from contracts.encoding import HopReceipt
from gwtf.errors import GwtfError
from node.store.database import Database
from node.store.models import Base, CertifiedHopRow, Countersignature, SignedHop

# Rows per statement: SQLite binds at most 32,766 parameters, a hop row has 18.
CHUNK = 1_000


class ConflictingReceipt(GwtfError):
    """A different receipt for a hop key this node already signed: signing it would be
    equivocation, so it is refused."""

    exit_code = 5


@dataclass(frozen=True)
class ToSign:
    """A receipt to sign under ``hop_key``: ``sign`` makes the signature, called only for a key
    this node holds no receipt of yet."""

    hop_key: bytes
    receipt: HopReceipt
    receipt_digest: bytes
    sign: Callable[[], bytes]


def receipt_columns(receipt: HopReceipt) -> dict[str, object]:
    """A receipt's fields under the tables' column names."""
    r = receipt
    return {
        "run_id": r.runId, "epoch": r.epoch, "data_node": r.dataNode, "iteration": r.iteration,
        "microbatch_id": r.microbatchId, "stage": r.stage, "direction": r.direction,
        "attempt": r.attempt, "worker": r.worker, "counterparty": r.counterparty,
        "input_digest": r.inputDigest, "output_digest": r.outputDigest, "units": r.units,
    }  # fmt: skip


def receipt_of(row: SignedHop | CertifiedHopRow) -> HopReceipt:
    return HopReceipt(
        row.run_id, row.epoch, row.data_node, row.iteration, row.microbatch_id, row.stage,
        row.direction, row.attempt, row.worker, row.counterparty, row.input_digest,
        row.output_digest, row.units,
    )  # fmt: skip


class HopStore:
    """The receipts of one node, in its database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ as worker
    def sign_once(self, batch: Sequence[ToSign]) -> list[bytes | ConflictingReceipt]:
        """Sign each receipt as worker, at most one per hop key: the signature of a receipt
        already held is returned again, a different receipt for a held key is refused."""
        return self._sign_once(SignedHop, batch, self._signed_row)

    def add_countersignatures(self, signatures: Sequence[tuple[bytes, bytes]]) -> None:
        """Complete the hops this node signed with their counterparties' countersignatures."""
        with self.db.sessions.begin() as session:
            for hop_key, signature in signatures:
                row = session.get(SignedHop, hop_key)
                if row is not None and row.counterparty_signature is None:
                    row.counterparty_signature = signature

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
            return [
                SignedReceipt(receipt_of(r), r.worker_signature, r.counterparty_signature or b"")
                for r in rows
            ]

    # ------------------------------------------------------------ as counterparty
    def countersign_once(self, batch: Sequence[ToSign]) -> list[bytes | ConflictingReceipt]:
        """Countersign each receipt, at most one per hop key (see ``sign_once``)."""
        return self._sign_once(Countersignature, batch, self._countersigned_row)

    # ------------------------------------------------------------ as data node
    def certify(self, entries: Sequence[tuple[bytes, bytes, SignedReceipt]]) -> None:
        """Record certified hops: (hop key, receipt digest, signed receipt); again is a no-op."""
        now = time.time()
        rows = [
            {
                "hop_key": key, "receipt_digest": digest,
                "worker_signature": e.worker_signature,
                "counterparty_signature": e.counterparty_signature, "certified_at": now,
                **receipt_columns(e.receipt),
            }
            for key, digest, e in entries
        ]  # fmt: skip
        with self.db.sessions.begin() as session:
            self._insert_new(session, CertifiedHopRow, rows)

    def certified_hops(self, run_id: int, epoch: int) -> list[SignedReceipt]:
        """Every hop this data node certified for an epoch."""
        with self.db.sessions() as session:
            rows = session.scalars(
                select(CertifiedHopRow).where(
                    CertifiedHopRow.run_id == run_id, CertifiedHopRow.epoch == epoch
                )
            )
            return [
                SignedReceipt(receipt_of(r), r.worker_signature, r.counterparty_signature)
                for r in rows
            ]

    # ------------------------------------------------------------ internals
    @staticmethod
    def _signed_row(item: ToSign, signature: bytes, now: float) -> dict[str, object]:
        return {
            "hop_key": item.hop_key, "receipt_digest": item.receipt_digest,
            "worker_signature": signature, "counterparty_signature": None, "signed_at": now,
            **receipt_columns(item.receipt),
        }  # fmt: skip

    @staticmethod
    def _countersigned_row(item: ToSign, signature: bytes, now: float) -> dict[str, object]:
        return {
            "hop_key": item.hop_key, "receipt_digest": item.receipt_digest,
            "signature": signature, "run_id": item.receipt.runId, "epoch": item.receipt.epoch,
            "signed_at": now,
        }  # fmt: skip

    def _sign_once(
        self,
        table: type[SignedHop] | type[Countersignature],
        batch: Sequence[ToSign],
        row_of: Callable[[ToSign, bytes, float], dict[str, object]],
    ) -> list[bytes | ConflictingReceipt]:
        now = time.time()
        keys = [item.hop_key for item in batch]
        with self.db.sessions.begin() as session:
            held = self._held(session, table, keys)
            results: list[bytes | ConflictingReceipt] = []
            fresh: dict[bytes, tuple[bytes, bytes]] = {}
            for item in batch:
                known = held.get(item.hop_key) or fresh.get(item.hop_key)
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
            rows = [
                row_of(item, fresh[item.hop_key][1], now)
                for item in batch
                if item.hop_key in fresh and fresh[item.hop_key][0] == item.receipt_digest
            ]
            self._insert_new(session, table, _unique_by_key(rows))
        return results

    @staticmethod
    def _held(
        session: Session, table: type[SignedHop] | type[Countersignature], keys: list[bytes]
    ) -> dict[bytes, tuple[bytes, bytes]]:
        held: dict[bytes, tuple[bytes, bytes]] = {}
        signature_column = (
            SignedHop.worker_signature if table is SignedHop else Countersignature.signature
        )
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            query = select(table.hop_key, table.receipt_digest, signature_column).where(
                table.hop_key.in_(chunk)
            )
            for key, digest, signature in session.execute(query):
                held[key] = (digest, signature)
        return held

    def _insert_new(
        self, session: Session, table: type[Base], rows: Sequence[dict[str, object]]
    ) -> None:
        """Insert rows whose primary key is new; rows already there are left as they are."""
        if not rows:
            return
        dialect = self.db.engine.dialect.name
        insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
        # One Core statement executed for many rows (the driver's executemany): the ORM's bulk
        # path costs several times more per row.
        statement = insert(table.__table__).on_conflict_do_nothing()  # type: ignore[arg-type]
        session.connection().execute(statement, list(rows))


def _unique_by_key(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    seen: dict[object, dict[str, object]] = {}
    for row in rows:
        seen.setdefault(row["hop_key"], row)
    return list(seen.values())

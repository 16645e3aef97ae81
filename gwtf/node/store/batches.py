"""Where a node keeps receipts signed in batches: the receipts of hops that travelled unsigned,
and the batches that sign them.

A hop's receipt is committed under its hop key as soon as the hop is computed (``record``):
one receipt per hop key for ever, the same commitment the per-hop path signs under
(``HopStore.commit_once``), so a node never
signs two batches holding different receipts for one hop. A batch is built only from receipts
committed here, ordered by hop key, and a receipt joins one batch only, in the transaction that
keeps the batch: a signature covering it is handed out only after that commit. The worker's
row (``close``) holds its signature; the receiver's (``countersign``) both, committed before
its countersignature leaves. A crash before a batch's commit leaves its receipts open (signed
by nobody); after it, the same batch is sent again (``unanswered``), never rebuilt. Pure
storage: the caller signs (``sign``) and checks signatures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, delete, func, insert, select, update

from gwtf.contracts.batches import batch_of
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import Eip712Domain, HopBatch, HopReceipt, hop_key, receipt_digest
from gwtf.contracts.merkle import build_tree
from gwtf.errors import ProtocolError
from gwtf.node.store.database import Database
from gwtf.node.store.hops import CHUNK, ConflictingReceipt, HopStore, hop_row
from gwtf.node.store.models import (
    BatchedReceipt,
    HopBatchRow,
    receipt_of,
)

WORKER, RECEIVER = "worker", "receiver"


class BatchRefused(ProtocolError):
    """A close request this node will not countersign (it names why: a hop it holds in another
    scope or batch, a root it does not rebuild)."""


class BatchPending(BatchRefused):
    """A close request naming hops this node holds no receipt of yet (the close may have
    overtaken them; a kept output's ack may have been lost): not countersigned now, the same
    request may be sent again. ``lacking``: those hops' keys, in hop key order."""

    def __init__(self, why: str, lacking: tuple[bytes, ...]) -> None:
        super().__init__(why)
        self.lacking = lacking


@dataclass(frozen=True)
class ClosedBatch:
    """A batch, its hops' keys in hop key order, the signatures it has and, when read back for
    reporting (``BatchStore.batches``), its receipts in the same order."""

    batch: HopBatch
    hop_keys: tuple[bytes, ...]
    worker_signature: bytes
    counterparty_signature: bytes | None = None
    receipts: tuple[HopReceipt, ...] = ()

    def sealed(self, domain: Eip712Domain) -> list[SignedReceipt]:
        """Each receipt with both signatures of the batch and its inclusion proof: what reports
        and evidence pages carry (only once countersigned)."""
        if self.counterparty_signature is None:
            raise ProtocolError("a batch not countersigned has no complete receipts")
        batch, tree = batch_of(self.receipts, domain)
        if batch != self.batch:  # the database was changed under the node
            raise ProtocolError(f"batch {self.batch.root.hex()}'s receipts do not make its root")
        return [
            SignedReceipt(
                r, self.worker_signature, self.counterparty_signature, tuple(tree.proof(i))
            )
            for i, r in enumerate(self.receipts)
        ]


class BatchStore:
    """The batched receipts of one node, in its database (beside its ``HopStore``)."""

    def __init__(self, db: Database, domain: Eip712Domain) -> None:
        self.db = db
        self.domain = domain
        self._hops = HopStore(db)  # its raw batch reads and writes

    # ------------------------------------------------------------ both ends
    def record(
        self,
        receipts: Sequence[HopReceipt],
        role: str,
        held: frozenset[bytes] = frozenset(),
        kept: frozenset[bytes] = frozenset(),
    ) -> list[bool]:
        """Commit each receipt, open, under its hop key, in one transaction: True when it is
        held now (again is a no-op), False when the key holds another receipt here (in a batch
        or signed per hop): that hop goes unreceipted rather than the node equivocating. Those
        whose key is in ``held`` join no batch until ``release``; those in ``kept`` are kept
        outputs' receipts (their counterparty may lack them: ``reopen``)."""
        if not receipts:  # a writer batch of one peer's hops has none of this node's: no commit
            return []
        now = time.time()
        prepared = [(hop_key(r), receipt_digest(r, self.domain), r) for r in receipts]
        with self.db.engine.begin() as connection:
            committed = self._hops.commit_once(
                connection, [(key, digest) for key, digest, _ in prepared]
            )
            results, rows = [], []
            for key, digest, receipt in prepared:
                results.append(committed[key] == digest)
                if committed[key] == digest:
                    flags = {"held": key in held, "kept": key in kept, "recorded_at": now}
                    rows.append(hop_row(key, digest, receipt, b"", None, role=role, **flags))
            for row in rows:  # no signatures in this table: the batch holds them
                del row["worker_signature"], row["counterparty_signature"]
            self._hops._insert_new(connection, BatchedReceipt, rows)
        return results

    def open_hops(
        self,
        run_id: int,
        epoch: int,
        worker: str,
        counterparty: str,
        role: str,
        limit: int,
        exclude: frozenset[bytes] = frozenset(),
    ) -> list[tuple[bytes, bytes]]:
        """(hop key, receipt digest) of up to ``limit`` receipts of the scope in no batch yet
        and not in ``exclude``, in hop key order: all a batch's root needs (the receipts are
        read back to report)."""
        m = self._hops._mark
        sql = (
            f"SELECT hop_key, receipt_digest FROM batched_receipts WHERE run_id = {m} AND "
            f"epoch = {m} AND worker = {m} AND counterparty = {m} AND role = {m} AND "
            f"batch_root IS NULL AND NOT held ORDER BY hop_key LIMIT {m}"
        )
        found = self._fetch(sql, (run_id, epoch, worker, counterparty, role, limit + len(exclude)))
        rows = [(bytes(key), bytes(digest)) for key, digest in found]
        return [row for row in rows if row[0] not in exclude][:limit]

    def open_counts(self, run_id: int, epoch: int, worker: str) -> dict[str, int]:
        """How many receipts of hops ``worker`` computed in an epoch wait for a batch, by
        receiver: what a restarted node has to close."""
        m = self._hops._mark
        sql = (
            f"SELECT counterparty, COUNT(*) FROM batched_receipts WHERE run_id = {m} AND "
            f"epoch = {m} AND worker = {m} AND role = {m} AND batch_root IS NULL AND NOT held "
            "GROUP BY counterparty"
        )
        found = self._fetch(sql, (run_id, epoch, worker, WORKER))
        return {str(receiver): int(count) for receiver, count in found}

    def open_epochs(self, run_id: int, worker: str) -> list[int]:
        """The epochs of a run in which ``worker`` has receipts to close (open, released) or
        batches to send again (signed, not countersigned): what a restarted node resumes."""
        m = self._hops._mark
        sql = (
            f"SELECT epoch FROM batched_receipts WHERE run_id = {m} AND worker = {m} AND "
            f"role = {m} AND batch_root IS NULL AND NOT held UNION SELECT epoch FROM "
            f"hop_batches WHERE run_id = {m} AND worker = {m} AND role = {m} AND "
            "counterparty_signature IS NULL"
        )
        found = self._fetch(sql, (run_id, worker, WORKER, run_id, worker, WORKER))
        return sorted(int(epoch) for (epoch,) in found)

    # ------------------------------------------------------------ as worker
    def release(self, keys: Sequence[bytes]) -> None:
        """Receipts recorded ``held`` may join a batch (their receiver holds them now)."""
        if not keys:
            return
        m = self._hops._mark
        sql = (
            f"UPDATE batched_receipts SET held = {m} WHERE hop_key = {m} AND role = {m} AND "
            "batch_root IS NULL"
        )
        with self.db.engine.begin() as connection:
            self._hops._executemany(connection, sql, [(False, key, WORKER) for key in keys])

    def reopen(self, batch: HopBatch, lacking: Sequence[bytes]) -> tuple[int, bool] | None:
        """Give up a batch this node signed that its receiver never countersigned because it
        lacks the receipts under ``lacking``: its other receipts are open again (the next close
        batches them), those stay out of every batch for ever (unpaid, never countersigned),
        in one transaction. (How many reopened, whether every one lacking is a kept output's,
        which its receiver may never have heard of); None if the batch is not held here
        unanswered (countersigned meanwhile, or given up already)."""
        m = self._hops._mark
        with self.db.engine.begin() as connection:
            row = connection.execute(
                select(HopBatchRow.root).where(
                    *_batch_key(batch),
                    HopBatchRow.role == WORKER,
                    HopBatchRow.counterparty_signature.is_(None),
                )
            ).first()
            if row is None:
                return None
            connection.execute(delete(HopBatchRow).where(*_batch_key(batch)))
            keys = [bytes(k) for (k,) in connection.execute(
                select(BatchedReceipt.hop_key).where(
                    BatchedReceipt.batch_root == batch.root, BatchedReceipt.role == WORKER,
                    *_scope(batch.runId, batch.epoch, batch.worker, batch.counterparty, WORKER),
                )
            )]  # fmt: skip
            gone = set(lacking)
            # The lacking ones keep the given-up root: no batch row names it, so they are in
            # no batch and never open again.
            sql = (
                "UPDATE batched_receipts SET batch_root = NULL, leaf_index = NULL, "
                f"batch_proof = NULL "
                f"WHERE hop_key = {m} AND batch_root = {m}"
            )
            reopened: list[tuple[object, ...]] = [(k, batch.root) for k in keys if k not in gone]
            if reopened:
                self._hops._executemany(connection, sql, reopened)
            kept = connection.execute(
                select(BatchedReceipt.kept).where(
                    BatchedReceipt.hop_key.in_([k for k in keys if k in gone]),
                    BatchedReceipt.role == WORKER,
                )
            ).scalars()
            return len(reopened), all(kept)

    def close(
        self,
        run_id: int,
        epoch: int,
        worker: str,
        counterparty: str,
        limit: int,
        sign: Callable[[bytes], bytes],
        exclude: frozenset[bytes] = frozenset(),
    ) -> ClosedBatch | None:
        """Put up to ``limit`` open receipts of this worker for ``counterparty`` (none of
        ``exclude``) in a batch, signed with ``sign`` over its digest and committed with them;
        None when none is open."""
        hops = self.open_hops(run_id, epoch, worker, counterparty, WORKER, limit, exclude)
        if not hops:
            return None
        root = build_tree([digest for _, digest in hops]).root
        batch = HopBatch(run_id, epoch, worker, counterparty, root)
        signature = sign(batch.digest(self.domain))  # handed out only after the commit below
        closed = ClosedBatch(batch, tuple(key for key, _ in hops), signature)
        self._commit(closed, WORKER, [digest for _, digest in hops])
        return closed

    def add_countersignature(self, batch: HopBatch, counterparty_signature: bytes) -> None:
        """Keep the receiver's countersignature of a batch this node signed."""
        with self.db.engine.begin() as connection:
            connection.execute(
                update(HopBatchRow)
                .where(*_batch_key(batch), HopBatchRow.counterparty_signature.is_(None))
                .values(counterparty_signature=counterparty_signature)
            )

    def unanswered(self, run_id: int, epoch: int) -> list[ClosedBatch]:
        """The batches this node signed as worker that no countersignature completes yet: sent
        again as they are after a restart, never rebuilt."""
        return [
            b
            for b in self.batches(run_id, epoch, WORKER, complete=False)
            if b.counterparty_signature is None
        ]

    # ------------------------------------------------------------ as receiver
    def countersign(
        self,
        batch: HopBatch,
        keys: Sequence[bytes],
        worker_signature: bytes,
        sign: Callable[[bytes], bytes],
    ) -> bytes:
        """Countersign the batch a worker closed over the receipts under ``keys``, rebuilt from
        this node's own committed receipts of hops that worker sent it, once the batch is
        committed with both signatures. The caller has checked ``worker_signature``. The same
        batch again gets the same countersignature, also when sent twice at once. Raises
        ``BatchPending`` naming a hop this node holds no receipt of yet, ``BatchRefused``
        naming one it holds in another scope or batch, or a root it does not rebuild."""
        if not keys or len(set(keys)) != len(keys):
            raise BatchRefused("a close request names each of its hops once, at least one")
        done = self._countersigned(batch)
        if done is not None:
            return done
        try:
            return self._countersign_new(batch, keys, worker_signature, sign)
        except BatchRefused:
            # The same batch sent again concurrently (a resend) and committed by the other
            # close: the same answer, not a refusal that would charge an honest worker.
            done = self._countersigned(batch)
            if done is not None:
                return done
            raise

    def _countersigned(self, batch: HopBatch) -> bytes | None:
        with self.db.sessions() as session:
            done = session.scalar(select(HopBatchRow).where(*_batch_key(batch)))
            if done is not None and done.role == RECEIVER and done.counterparty_signature:
                return bytes(done.counterparty_signature)
        return None

    def _countersign_new(
        self,
        batch: HopBatch,
        keys: Sequence[bytes],
        worker_signature: bytes,
        sign: Callable[[bytes], bytes],
    ) -> bytes:
        ordered = sorted(keys)
        columns = "hop_key, role, batch_root, run_id, epoch, worker, counterparty, receipt_digest"
        rows: dict[bytes, tuple[Any, ...]] = {}
        lacking: tuple[bytes, ...] = ()
        with self.db.engine.begin() as connection:
            # In hop key order, a chunk at a time, up to the first chunk that lacks most of its
            # hops: a request naming keys this node never held costs it one chunk's read and
            # names at most a chunk of them; an honest close, lacking at most a few kept
            # outputs' receipts, is read whole and names every hop it lacks.
            for start in range(0, len(ordered), CHUNK):
                chunk = ordered[start : start + CHUNK]
                found = self._hops._rows_of(connection, BatchedReceipt, columns, chunk)
                rows.update((bytes(row[0]), tuple(row[1:])) for row in found)
                missing = tuple(key for key in chunk if key not in rows)
                lacking += missing
                if 2 * len(missing) > len(chunk):
                    break
        scope = (RECEIVER, None, batch.runId, batch.epoch, batch.worker, batch.counterparty)
        if lacking:
            raise BatchPending(
                f"batch of {batch.worker}: this node holds no receipt of {len(lacking)} of its "
                f"hops yet, first {lacking[0].hex()}",
                lacking,
            )
        digests = []
        for key in ordered:
            row = rows[key]
            if tuple(row[:6]) != scope:
                raise BatchRefused(
                    f"batch of {batch.worker}: this node holds no open receipt of hop "
                    f"{key.hex()} that worker sent it in run {batch.runId} epoch {batch.epoch}"
                )
            digests.append(bytes(row[6]))
        if build_tree(digests).root != batch.root:
            raise BatchRefused(
                f"batch of {batch.worker}: its root is not the one of this node's receipts "
                f"of its {len(keys)} hops"
            )
        counter = sign(batch.digest(self.domain))
        try:
            closed = ClosedBatch(batch, tuple(ordered), worker_signature, counter)
            self._commit(closed, RECEIVER, digests)
        except ConflictingReceipt as exc:  # a close of an overlapping batch committed first
            raise BatchRefused(str(exc)) from exc
        return counter

    # ------------------------------------------------------------ read
    def batches(
        self, run_id: int, epoch: int, role: str, complete: bool = True
    ) -> list[ClosedBatch]:
        """This node's batches of an epoch in ``role`` (only countersigned ones if
        ``complete``), each with its receipts in hop key order."""
        query = select(HopBatchRow).where(
            HopBatchRow.run_id == run_id, HopBatchRow.epoch == epoch, HopBatchRow.role == role
        )
        if complete:
            query = query.where(HopBatchRow.counterparty_signature.is_not(None))
        return self._read(query, role)

    def batch(self, batch: HopBatch, role: str) -> ClosedBatch | None:
        """One batch of this node's in ``role``, with its receipts; None if not held."""
        query = select(HopBatchRow).where(*_batch_key(batch), HopBatchRow.role == role)
        found = self._read(query, role)
        return found[0] if found else None

    def sealed(self, run_id: int, epoch: int, role: str) -> list[SignedReceipt]:
        """The complete receipts of an epoch's countersigned batches in ``role``, each with
        both signatures and its proof, in hop key order: what a node reports and serves."""
        return self._sealed_rows(run_id, epoch, role)

    def page(
        self, role: str, run_id: int, epoch: int, offset: int, limit: int
    ) -> tuple[int, list[SignedReceipt]]:
        """(how many, ``limit`` from ``offset``) of ``sealed``: read as they are stored, with
        their proofs, no batch rebuilt."""
        with self.db.sessions() as session:
            total = session.scalar(
                select(func.count())
                .select_from(BatchedReceipt)
                .join(HopBatchRow, _sealed_join())
                .where(*_sealed_scope(run_id, epoch, role))
            )
        return int(total or 0), self._sealed_rows(run_id, epoch, role, offset, limit)

    def _sealed_rows(
        self, run_id: int, epoch: int, role: str, offset: int = 0, limit: int | None = None
    ) -> list[SignedReceipt]:
        query = (
            select(BatchedReceipt, HopBatchRow.worker_signature, HopBatchRow.counterparty_signature)
            .join(HopBatchRow, _sealed_join())
            .where(*_sealed_scope(run_id, epoch, role))
            .order_by(BatchedReceipt.hop_key)
            .offset(offset)
            .limit(limit)
        )
        with self.db.sessions() as session:
            return [
                SignedReceipt(receipt_of(row), worker, counter or b"", _hashes(row.batch_proof))
                for row, worker, counter in session.execute(query)
                if row.batch_proof is not None
            ]

    def worked_epochs(self, run_id: int) -> list[tuple[int, str]]:
        """(epoch, data node) pairs of which this node recorded receipts as worker: batched
        or not here, it has work to claim there."""
        with self.db.sessions() as session:
            rows = session.execute(
                select(BatchedReceipt.epoch, BatchedReceipt.data_node)
                .where(BatchedReceipt.run_id == run_id, BatchedReceipt.role == WORKER)
                .distinct()
            )
            return [(int(epoch), str(node)) for epoch, node in rows]

    def _read(self, query: Select[HopBatchRow], role: str) -> list[ClosedBatch]:
        with self.db.sessions() as session:
            closed = []
            for b in session.scalars(query):
                rows = session.scalars(
                    select(BatchedReceipt)
                    .where(BatchedReceipt.batch_root == b.root, BatchedReceipt.role == role)
                    .where(*_scope(b.run_id, b.epoch, b.worker, b.counterparty, role))
                    .order_by(BatchedReceipt.leaf_index)
                )
                batch = HopBatch(b.run_id, b.epoch, b.worker, b.counterparty, b.root)
                receipts = tuple(receipt_of(r) for r in rows)
                closed.append(
                    ClosedBatch(
                        batch,
                        tuple(hop_key(r) for r in receipts),
                        b.worker_signature,
                        b.counterparty_signature,
                        receipts,
                    )
                )
            return closed

    # ------------------------------------------------------------ internals
    def _fetch(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        """Rows of one raw statement on the driver's cursor, as the hop store's reads."""
        with (
            self.db.engine.begin() as connection,
            closing(connection.connection.cursor()) as cursor,
        ):
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def _commit(self, closed: ClosedBatch, role: str, digests: Sequence[bytes]) -> None:
        """Keep ``closed`` and put its receipts (their ``digests`` in its order) in it, each
        with its proof, in one transaction; a receipt already in another batch aborts it all
        (the batch is then refused, nothing signed is handed out)."""
        b = closed.batch
        tree = build_tree(digests)
        m = self._hops._mark
        sql = (
            f"UPDATE batched_receipts SET batch_root = {m}, leaf_index = {m}, batch_proof = {m} "
            f"WHERE hop_key = {m} AND batch_root IS NULL"
        )
        with self.db.engine.begin() as connection:
            # The driver's executemany, as the hop store's writes: one statement per receipt
            # through SQLAlchemy would cost more than the batch's signature.
            with closing(connection.connection.cursor()) as cursor:
                cursor.executemany(
                    sql,
                    [
                        (b.root, index, b"".join(tree.proof(index)), key)
                        for index, key in enumerate(closed.hop_keys)
                    ],
                )
                moved = cursor.rowcount
            if moved != len(closed.hop_keys):
                raise ConflictingReceipt(
                    f"a hop of batch {b.root.hex()} is in another batch already; not signing "
                    "a second"
                )
            connection.execute(
                insert(HopBatchRow).values(
                    run_id=b.runId, epoch=b.epoch, worker=b.worker, counterparty=b.counterparty,
                    root=b.root, role=role, count=len(closed.hop_keys),
                    worker_signature=closed.worker_signature,
                    counterparty_signature=closed.counterparty_signature, closed_at=time.time(),
                )
            )  # fmt: skip


def _scope(
    run_id: int, epoch: int, worker: str, counterparty: str, role: str
) -> list[ColumnElement[bool]]:
    return [
        BatchedReceipt.run_id == run_id,
        BatchedReceipt.epoch == epoch,
        BatchedReceipt.worker == worker,
        BatchedReceipt.counterparty == counterparty,
        BatchedReceipt.role == role,
    ]


def _hashes(proof: bytes) -> tuple[bytes, ...]:
    return tuple(proof[i : i + 32] for i in range(0, len(proof), 32))


def _sealed_join() -> ColumnElement[bool]:
    """A receipt row's batch row (same root, parties, run, epoch and role)."""
    return and_(
        HopBatchRow.root == BatchedReceipt.batch_root,
        HopBatchRow.run_id == BatchedReceipt.run_id,
        HopBatchRow.epoch == BatchedReceipt.epoch,
        HopBatchRow.worker == BatchedReceipt.worker,
        HopBatchRow.counterparty == BatchedReceipt.counterparty,
        HopBatchRow.role == BatchedReceipt.role,
    )


def _sealed_scope(run_id: int, epoch: int, role: str) -> list[ColumnElement[bool]]:
    return [
        BatchedReceipt.run_id == run_id,
        BatchedReceipt.epoch == epoch,
        BatchedReceipt.role == role,
        HopBatchRow.counterparty_signature.is_not(None),
    ]


def _batch_key(batch: HopBatch) -> list[ColumnElement[bool]]:
    return [
        HopBatchRow.run_id == batch.runId,
        HopBatchRow.epoch == batch.epoch,
        HopBatchRow.worker == batch.worker,
        HopBatchRow.counterparty == batch.counterparty,
        HopBatchRow.root == batch.root,
    ]

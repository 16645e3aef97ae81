"""Read-only queries of the node database for its operator: work done per epoch, receipts page
by page, claims. The local API and ``gwtf-node earnings|receipts`` read through here."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, func, select

from gwtf.contracts.encoding import HopReceipt
from gwtf.node.store.batches import WORKER
from gwtf.node.store.database import Database
from gwtf.node.store.models import (
    RECEIPT_COLUMNS,
    BatchedReceipt,
    HopBatchRow,
    HopProof,
    RewardClaim,
    receipt_of,
)

#: epoch → data node → units of this node's countersigned receipts for that data node's
#: microbatches; a data node it signed receipts for that none countersigned is there with 0.
Work = dict[int, dict[str, int]]


@dataclass(frozen=True)
class ReceiptRow:
    """A receipt of this node's, with its signatures and, once paid, its place in a certificate."""

    hop_key: bytes
    receipt_digest: bytes
    receipt: HopReceipt
    worker_signature: bytes
    counterparty_signature: bytes | None
    at: float
    as_worker: bool
    # Its batch's root and its Merkle proof in that batch (leaf to root, 32 bytes a hash;
    # None for a batch of one); the batch root is None while the receipt is open.
    batch_root: bytes | None = None
    batch_proof: bytes | None = None
    # Where the hop sits in the certificate it was paid from (``HopProof``); None before.
    leaf_index: int | None = None
    units_before: int | None = None
    signatures_hash: bytes | None = None
    root: bytes | None = None
    proof: bytes | None = None


FIELDS = ("hop_key", "receipt_digest", *RECEIPT_COLUMNS.values(), "worker_signature",
          "counterparty_signature")  # fmt: skip
# A page's columns that are not the receipt's own.
_OTHERS = tuple(f.name for f in fields(ReceiptRow) if f.name != "receipt")


def _receipt_row(row: Row[Any]) -> ReceiptRow:
    values = row._mapping
    return ReceiptRow(receipt=receipt_of(row), **{name: values[name] for name in _OTHERS})


class NodeRecords:
    """What the node's database says of its own work, for the node's operator."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def work(self, run_id: int) -> Work:
        work: Work = defaultdict(dict)
        r, b = BatchedReceipt, HopBatchRow
        complete = func.sum(r.units).filter(b.counterparty_signature.is_not(None))
        query = (
            select(r.epoch, r.data_node, complete)
            .outerjoin(b, _in_batch())
            .where(r.run_id == run_id, r.role == WORKER)
            .group_by(r.epoch, r.data_node)
        )
        with self.db.sessions() as session:
            for epoch, data_node, total in session.execute(query):
                work[epoch][data_node] = int(total or 0)
        return dict(work)

    def claims(self, run_id: int) -> list[RewardClaim]:
        with self.db.sessions() as session:
            query = select(RewardClaim).where(RewardClaim.run_id == run_id)
            return list(session.scalars(query.order_by(RewardClaim.epoch, RewardClaim.data_node)))

    def receipts(
        self, run_id: int, offset: int, limit: int, epoch: int | None = None
    ) -> tuple[int, list[ReceiptRow]]:
        """(how many, a page of) the receipts this node signed as worker or countersigned as
        receiver, newest first."""

        r, b = BatchedReceipt, HopBatchRow
        where = [r.run_id == run_id]
        if epoch is not None:
            where.append(r.epoch == epoch)
        # An open receipt (in no batch yet) has no signature: b"" for the worker's.
        both = (
            select(
                *[getattr(r, name) for name in FIELDS[:-2]],
                func.coalesce(b.worker_signature, b"").label("worker_signature"),
                b.counterparty_signature,
                r.recorded_at.label("at"),
                (r.role == WORKER).label("as_worker"),
                r.batch_root,
                r.batch_proof,
            )
            .outerjoin(b, _in_batch())
            .where(*where)
            .subquery()
        )
        proofs = [HopProof.leaf_index, HopProof.units_before, HopProof.signatures_hash,
                  HopProof.root, HopProof.proof]  # fmt: skip
        page = (
            select(both, *proofs)
            .outerjoin(HopProof, HopProof.hop_key == both.c.hop_key)
            .order_by(both.c.at.desc(), both.c.hop_key)
            .offset(offset)
            .limit(limit)
        )
        with self.db.sessions() as session:
            total = session.scalar(select(func.count()).select_from(both)) or 0
            return int(total), [_receipt_row(row) for row in session.execute(page)]


def _in_batch() -> ColumnElement[bool]:
    """A batched receipt's batch row (none while it is open)."""
    r, b = BatchedReceipt, HopBatchRow
    return and_(
        b.root == r.batch_root, b.run_id == r.run_id, b.epoch == r.epoch,
        b.worker == r.worker, b.counterparty == r.counterparty,
    )  # fmt: skip

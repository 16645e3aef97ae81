"""What a node sent to the ledger and what became of it: its certificates and its claims, and
where its hops sit in the certificates it claimed from (their Merkle proofs).

A row is written before its transaction is sent (status ``pending``), and again once it is
mined (``confirmed``, with its hash) or refused (``failed``, with the error). After a crash in
between, the epoch cycle asks the chain what happened (``gwtf.node.receipts.epochs``) before it
sends anything again, so a node never submits an epoch twice nor claims twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from gwtf.node.store.database import Database
from gwtf.node.store.models import EpochCertificate, HopProof, RewardClaim

#: Proofs written per transaction.
PROOFS_PER_WRITE = 500


@dataclass(frozen=True)
class KeptProof:
    """One hop's leaf in a certificate and its Merkle proof, checked against ``root``."""

    hop_key: bytes
    leaf_index: int
    units_before: int
    signatures_hash: bytes
    root: bytes
    proof: tuple[bytes, ...]


class LedgerRecords:
    """The node's certificates (as a data node) and claims (as a worker), in its database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def certificate(self, run_id: int, epoch: int, data_node: str) -> EpochCertificate | None:
        with self.db.sessions() as session:
            return session.get(EpochCertificate, (run_id, epoch, data_node))

    def save_certificate(
        self,
        run_id: int,
        epoch: int,
        data_node: str,
        root: bytes,
        count: int,
        units: int,
        status: str,
        tx_hash: bytes | None = None,
        error: str | None = None,
    ) -> None:
        row = EpochCertificate(
            run_id=run_id, epoch=epoch, data_node=data_node, root=root, count=count,
            units=units, status=status, tx_hash=tx_hash, error=_short(error),
            updated_at=time.time(),
        )  # fmt: skip
        with self.db.sessions.begin() as session:
            session.merge(row)

    def certificates(self, run_id: int) -> list[EpochCertificate]:
        with self.db.sessions() as session:
            query = select(EpochCertificate).where(EpochCertificate.run_id == run_id)
            return list(session.scalars(query.order_by(EpochCertificate.epoch)))

    def claim(self, run_id: int, epoch: int, data_node: str, node: str) -> RewardClaim | None:
        with self.db.sessions() as session:
            return session.get(RewardClaim, (run_id, epoch, data_node, node))

    def save_claim(
        self,
        run_id: int,
        epoch: int,
        data_node: str,
        node: str,
        units: int,
        status: str,
        amount_wei: int | None = None,
        tx_hash: bytes | None = None,
        error: str | None = None,
    ) -> None:
        row = RewardClaim(
            run_id=run_id, epoch=epoch, data_node=data_node, node=node, units=units,
            amount_wei=None if amount_wei is None else str(amount_wei), status=status,
            tx_hash=tx_hash, error=_short(error), updated_at=time.time(),
        )  # fmt: skip
        with self.db.sessions.begin() as session:
            session.merge(row)

    def claims(self, run_id: int) -> list[RewardClaim]:
        with self.db.sessions() as session:
            query = select(RewardClaim).where(RewardClaim.run_id == run_id)
            return list(session.scalars(query.order_by(RewardClaim.epoch)))

    def save_proofs(
        self, run_id: int, epoch: int, data_node: str, proofs: Sequence[KeptProof]
    ) -> None:
        """Keep where this node's hops sit in ``data_node``'s certificate (a proof kept before
        stays). Written in short transactions of ``PROOFS_PER_WRITE``: the write lock is never
        held for long, so the receipts signed meanwhile are not held up."""
        rows = [
            {
                "hop_key": p.hop_key, "run_id": run_id, "epoch": epoch, "data_node": data_node,
                "leaf_index": p.leaf_index, "units_before": p.units_before,
                "signatures_hash": p.signatures_hash, "root": p.root, "proof": b"".join(p.proof),
            }
            for p in proofs
        ]  # fmt: skip
        dialect = self.db.engine.dialect.name
        insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
        statement = insert(HopProof).on_conflict_do_nothing(index_elements=["hop_key"])
        for start in range(0, len(rows), PROOFS_PER_WRITE):
            with self.db.engine.begin() as connection:
                connection.execute(statement, rows[start : start + PROOFS_PER_WRITE])


def _short(error: str | None) -> str | None:
    return None if error is None else error[:400]

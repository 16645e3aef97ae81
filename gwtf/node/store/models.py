"""The node database's tables, as SQLAlchemy 2 typed models.

Every table is keyed by what makes a row unique on chain or in the protocol, so writing a row
twice (a retry, a restart replaying its work) changes nothing: a hop by its hop key, an epoch's
certificate by (run, epoch, data node), a claim by (run, epoch, data node, node), a transaction
by its hash. Amounts in wei are decimal text (a uint256 does not fit SQLite's integers). The
migrations in ``gwtf/migrations/versions`` create exactly these tables; ``alembic check`` in the
tests keeps the two in step.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from sqlalchemy import BigInteger, Boolean, Index, LargeBinary, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gwtf.contracts.encoding import HOP_RECEIPT_FIELDS, HopReceipt, snake_case

HASH = LargeBinary(32)
SIGNATURE = LargeBinary(65)
#: A Merkle proof of a tree of up to 2**64 leaves: 64 hashes.
MAX_PROOF_BYTES = 64 * 32
ADDRESS = String(42)
WEI = String(78)  # decimal text of a uint256


class Base(DeclarativeBase):
    # 64-bit columns everywhere: PostgreSQL's integer is 32-bit, and microbatch ids, units and
    # epochs outgrow it. (Values of 2**63 and more are refused by both databases.)
    type_annotation_map: ClassVar[dict[Any, Any]] = {int: BigInteger}


class ReceiptFields:
    """The columns of a ``HopReceipt``: its fields in snake case (``RECEIPT_COLUMNS``), a uint
    as a 64-bit integer, an address as its checksummed text, a bytes32 as 32 bytes. Declared
    here for the typed queries; ``receipt_columns`` and ``receipt_of`` convert, and a test
    keeps these columns the receipt's fields."""

    run_id: Mapped[int]
    epoch: Mapped[int]
    data_node: Mapped[str] = mapped_column(ADDRESS)
    iteration: Mapped[int]
    microbatch_id: Mapped[int]
    stage: Mapped[int]
    direction: Mapped[int]
    attempt: Mapped[int]
    worker: Mapped[str] = mapped_column(ADDRESS)
    counterparty: Mapped[str] = mapped_column(ADDRESS)
    input_digest: Mapped[bytes] = mapped_column(HASH)
    output_digest: Mapped[bytes] = mapped_column(HASH)
    units: Mapped[int]


#: The column of each ``HopReceipt`` field, in struct order.
RECEIPT_COLUMNS: Final = {name: snake_case(name) for name, _ in HOP_RECEIPT_FIELDS}


def receipt_columns(receipt: HopReceipt) -> dict[str, object]:
    """A receipt's fields under the tables' column names."""
    return {column: getattr(receipt, name) for name, column in RECEIPT_COLUMNS.items()}


def receipt_of(row: object) -> HopReceipt:
    """The receipt a row holds (a model's or a query's row with the receipt's columns), checked
    again as it is built."""
    return HopReceipt(**{name: getattr(row, column) for name, column in RECEIPT_COLUMNS.items()})


class SignedHop(ReceiptFields, Base):
    """A hop this node computed and signed, as worker; complete once countersigned."""

    __tablename__ = "signed_hops"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    worker_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    counterparty_signature: Mapped[bytes | None] = mapped_column(SIGNATURE)
    signed_at: Mapped[float]
    __table_args__ = (Index("ix_signed_hops_epoch", "run_id", "epoch"),)


class HopCommitment(Base):
    """The one receipt this node committed to under a hop key, whatever path signs it (per hop
    as worker or receiver, or in a batch): every path inserts here first and reads the row
    back in the same transaction, so two paths never sign two versions of one hop."""

    __tablename__ = "hop_commitments"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)


class Countersignature(Base):
    """A hop this node countersigned, as the receiver of its output: one receipt per hop key,
    for ever, so the node never signs two versions of one hop (that would get it slashed)."""

    __tablename__ = "countersignatures"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    signature: Mapped[bytes] = mapped_column(SIGNATURE)
    run_id: Mapped[int]
    epoch: Mapped[int]
    signed_at: Mapped[float]


class ReceivedHop(ReceiptFields, Base):
    """A hop this node countersigned, whole: the receipt with its worker's signature and this
    node's. Committed before the ack, so the work a countersignature vouches for survives
    either end's crash: a relay reports it to the data node beside the worker (a data node
    certifies its own straight from here)."""

    __tablename__ = "received_hops"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    worker_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    counterparty_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    received_at: Mapped[float]
    __table_args__ = (Index("ix_received_hops_epoch", "run_id", "epoch"),)


class CertifiedHopRow(ReceiptFields, Base):
    """A hop a data node certified: the whole receipt with both signatures, which an auditor
    needs to check the certificate's leaves."""

    __tablename__ = "certified_hops"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    worker_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    counterparty_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    #: The receipt's proof in the batch both signed (hashes, concatenated); null: a batch of one.
    batch_proof: Mapped[bytes | None] = mapped_column(LargeBinary(MAX_PROOF_BYTES))
    certified_at: Mapped[float]
    __table_args__ = (Index("ix_certified_hops_epoch", "run_id", "epoch"),)


class HopProof(Base):
    """Where one of this node's hops sits in a data node's certificate on chain: its leaf's
    index, the root and the Merkle proof (32-byte hashes, concatenated), as the data node
    served them and this node checked them against the root before keeping them."""

    __tablename__ = "hop_proofs"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    run_id: Mapped[int]
    epoch: Mapped[int]
    data_node: Mapped[str] = mapped_column(ADDRESS)
    leaf_index: Mapped[int]
    units_before: Mapped[int]
    signatures_hash: Mapped[bytes] = mapped_column(HASH)
    root: Mapped[bytes] = mapped_column(HASH)
    proof: Mapped[bytes] = mapped_column(LargeBinary(MAX_PROOF_BYTES))
    __table_args__ = (Index("ix_hop_proofs_epoch", "run_id", "epoch"),)


class ReportedHop(ReceiptFields, Base):
    """A complete receipt a worker reported to this data node: what its certificate is built
    from, once the epoch is over (``gwtf.node.receipts.certify`` decides which it certifies)."""

    __tablename__ = "reported_hops"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    # Computed as the receipt is checked, so the epoch's tree needs no hashing but its own.
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    signatures_hash: Mapped[bytes] = mapped_column(HASH)
    worker_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    counterparty_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    #: The receipt's proof in the batch both signed (hashes, concatenated); null: a batch of one.
    batch_proof: Mapped[bytes | None] = mapped_column(LargeBinary(MAX_PROOF_BYTES))
    reported_at: Mapped[float]
    __table_args__ = (Index("ix_reported_hops_epoch", "run_id", "epoch"),)


class BatchedReceipt(ReceiptFields, Base):
    """A receipt this node committed for a hop it computed (``role`` worker) or received
    (receiver) that travelled with no signature: it waits, open (``batch_root`` null), for the
    batch of its run, epoch and parties that will sign it; once in a batch it is in that one
    for ever (its root and leaf index), so no crash or retry puts a hop in two batches."""

    __tablename__ = "batched_receipts"
    hop_key: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    receipt_digest: Mapped[bytes] = mapped_column(HASH)
    role: Mapped[str] = mapped_column(String(8))  # worker | receiver
    batch_root: Mapped[bytes | None] = mapped_column(HASH)
    leaf_index: Mapped[int | None]
    # Its proof in its batch (the hashes concatenated), stored with the batch: reports and
    # pages read it, no batch's tree is built again per request.
    batch_proof: Mapped[bytes | None] = mapped_column(LargeBinary(2048))
    recorded_at: Mapped[float]
    # A worker's receipt that joins no batch until released (a send until acked, a backward
    # until its forward's batch is countersigned): on disk, so a restarted node closes only
    # hops its receiver holds (one never released stays open: unpaid, never signed).
    held: Mapped[bool] = mapped_column(Boolean)
    # A kept output's receipt, recorded before the ack that tells its counterparty of it: the
    # counterparty may never have seen it (a lost ack), so lacking it is no one's fault.
    kept: Mapped[bool] = mapped_column(Boolean)
    # A close reads a scope's open rows in hop key order (only open rows are indexed there,
    # so closed batches cost it nothing); a report reads a batch's rows in leaf order.
    __table_args__ = (
        Index(
            "ix_batched_receipts_open", "run_id", "epoch", "worker", "counterparty", "role",
            "hop_key", sqlite_where=text("batch_root IS NULL"),
            postgresql_where=text("batch_root IS NULL"),
        ),
        Index("ix_batched_receipts_batch", "batch_root", "leaf_index"),
    )  # fmt: skip


class HopBatchRow(Base):
    """A batch of receipts this node signed as worker or countersigned as receiver: the
    ``HopBatch`` (run, epoch, parties, root) with the signatures it has. A worker's row is
    committed with its own signature before the close request leaves; a receiver's with both
    before its countersignature does."""

    __tablename__ = "hop_batches"
    run_id: Mapped[int] = mapped_column(primary_key=True)
    epoch: Mapped[int] = mapped_column(primary_key=True)
    worker: Mapped[str] = mapped_column(ADDRESS, primary_key=True)
    counterparty: Mapped[str] = mapped_column(ADDRESS, primary_key=True)
    root: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    role: Mapped[str] = mapped_column(String(8))
    count: Mapped[int]
    worker_signature: Mapped[bytes] = mapped_column(SIGNATURE)
    counterparty_signature: Mapped[bytes | None] = mapped_column(SIGNATURE)
    closed_at: Mapped[float]


class OriginDigest(Base):
    """A frame this data node sent to start a chain of hops (a first forward, a loss
    gradient): the anchors its certificate's hops are chained to."""

    __tablename__ = "origin_digests"
    run_id: Mapped[int] = mapped_column(primary_key=True)
    epoch: Mapped[int] = mapped_column(primary_key=True)
    iteration: Mapped[int] = mapped_column(primary_key=True)
    microbatch_id: Mapped[int] = mapped_column(primary_key=True)
    direction: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[bytes] = mapped_column(HASH, primary_key=True)


class Transaction:
    """The columns of a transaction the node sends: where it stands, and what went wrong."""

    status: Mapped[str] = mapped_column(String(16))  # pending | sent | confirmed | failed
    tx_hash: Mapped[bytes | None] = mapped_column(HASH)
    error: Mapped[str | None] = mapped_column(String(400))
    updated_at: Mapped[float]


class EpochCertificate(Transaction, Base):
    """A data node's certificate of one epoch: built, then submitted, then on chain."""

    __tablename__ = "epoch_certificates"
    run_id: Mapped[int] = mapped_column(primary_key=True)
    epoch: Mapped[int] = mapped_column(primary_key=True)
    data_node: Mapped[str] = mapped_column(ADDRESS, primary_key=True)
    root: Mapped[bytes] = mapped_column(HASH)
    count: Mapped[int]
    units: Mapped[int]


class RewardClaim(Transaction, Base):
    """A worker's claim of its range of one data node's certificate of one epoch."""

    __tablename__ = "reward_claims"
    run_id: Mapped[int] = mapped_column(primary_key=True)
    epoch: Mapped[int] = mapped_column(primary_key=True)
    data_node: Mapped[str] = mapped_column(ADDRESS, primary_key=True)
    node: Mapped[str] = mapped_column(ADDRESS, primary_key=True)
    units: Mapped[int]
    amount_wei: Mapped[str | None] = mapped_column(WEI)


class Slash(Base):
    """A slash this node saw on chain (of anyone), from the Disputes contract's events."""

    __tablename__ = "slashes"
    tx_hash: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    node: Mapped[str] = mapped_column(ADDRESS)
    run_id: Mapped[int]
    epoch: Mapped[int]
    fraud: Mapped[str] = mapped_column(String(16))
    slashed_wei: Mapped[str] = mapped_column(WEI)
    bounty_wei: Mapped[str] = mapped_column(WEI)
    challenger: Mapped[str] = mapped_column(ADDRESS)


class ChallengeSeen(Base):
    """A fraud-proof commitment this node saw or made, and what became of it."""

    __tablename__ = "challenges_seen"
    commitment: Mapped[bytes] = mapped_column(HASH, primary_key=True)
    challenger: Mapped[str] = mapped_column(ADDRESS)
    accused: Mapped[str | None] = mapped_column(ADDRESS)
    run_id: Mapped[int | None]
    epoch: Mapped[int | None]
    outcome: Mapped[str] = mapped_column(String(16))  # committed | proven | refused
    seen_at: Mapped[float]


class Peer(Base):
    """A peer this node met: its libp2p id, the node behind it, and how it behaved."""

    __tablename__ = "peers"
    peer_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_address: Mapped[str | None] = mapped_column(ADDRESS)
    first_seen: Mapped[float]
    last_seen: Mapped[float]
    refusals: Mapped[int] = mapped_column(default=0)
    offences: Mapped[int] = mapped_column(default=0)

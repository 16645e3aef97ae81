"""receipts signed in batches and one commitment per hop key: the receipts waiting for or
held in a batch, the batches, each hop key's one receipt digest, and each reported or
certified receipt's proof in its batch

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07 09:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("certified_hops", "reported_hops"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("batch_proof", sa.LargeBinary(length=2048), nullable=True)
            )
    op.create_table(
        "hop_commitments",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.PrimaryKeyConstraint("hop_key"),
    )
    # Every receipt signed so far is a commitment (a node is worker or receiver of a hop,
    # never both, so the two tables share no key).
    for table in ("signed_hops", "countersignatures"):
        op.execute(
            f"INSERT INTO hop_commitments (hop_key, receipt_digest) "
            f"SELECT hop_key, receipt_digest FROM {table} WHERE true ON CONFLICT DO NOTHING"
        )
    op.create_table(
        "batched_receipts",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("batch_root", sa.LargeBinary(length=32), nullable=True),
        sa.Column("leaf_index", sa.BigInteger(), nullable=True),
        sa.Column("batch_proof", sa.LargeBinary(length=2048), nullable=True),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("kept", sa.Boolean(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("data_node", sa.String(length=42), nullable=False),
        sa.Column("iteration", sa.BigInteger(), nullable=False),
        sa.Column("microbatch_id", sa.BigInteger(), nullable=False),
        sa.Column("stage", sa.BigInteger(), nullable=False),
        sa.Column("direction", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.BigInteger(), nullable=False),
        sa.Column("worker", sa.String(length=42), nullable=False),
        sa.Column("counterparty", sa.String(length=42), nullable=False),
        sa.Column("input_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("output_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hop_key"),
    )
    with op.batch_alter_table("batched_receipts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_batched_receipts_open",
            ["run_id", "epoch", "worker", "counterparty", "role", "hop_key"],
            unique=False,
            sqlite_where=sa.text("batch_root IS NULL"),
            postgresql_where=sa.text("batch_root IS NULL"),
        )
        batch_op.create_index(
            "ix_batched_receipts_batch", ["batch_root", "leaf_index"], unique=False
        )
    op.create_table(
        "hop_batches",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("worker", sa.String(length=42), nullable=False),
        sa.Column("counterparty", sa.String(length=42), nullable=False),
        sa.Column("root", sa.LargeBinary(length=32), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("worker_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("counterparty_signature", sa.LargeBinary(length=65), nullable=True),
        sa.Column("closed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "epoch", "worker", "counterparty", "root"),
    )


def downgrade() -> None:
    op.drop_table("hop_batches")
    with op.batch_alter_table("batched_receipts", schema=None) as batch_op:
        batch_op.drop_index("ix_batched_receipts_batch")
        batch_op.drop_index("ix_batched_receipts_open")
    op.drop_table("batched_receipts")
    op.drop_table("hop_commitments")
    for table in ("certified_hops", "reported_hops"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("batch_proof")

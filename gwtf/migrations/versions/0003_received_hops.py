"""the whole receipts of hops a node countersigned

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 04:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "received_hops",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("worker_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("counterparty_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
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
    with op.batch_alter_table("received_hops", schema=None) as batch_op:
        batch_op.create_index("ix_received_hops_epoch", ["run_id", "epoch"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("received_hops", schema=None) as batch_op:
        batch_op.drop_index("ix_received_hops_epoch")
    op.drop_table("received_hops")

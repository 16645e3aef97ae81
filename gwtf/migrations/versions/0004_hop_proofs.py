"""where a node's hops sit in the certificates on chain: leaf, root, Merkle proof

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hop_proofs",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("data_node", sa.String(length=42), nullable=False),
        sa.Column("leaf_index", sa.BigInteger(), nullable=False),
        sa.Column("units_before", sa.BigInteger(), nullable=False),
        sa.Column("signatures_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("root", sa.LargeBinary(length=32), nullable=False),
        sa.Column("proof", sa.LargeBinary(length=2048), nullable=False),
        sa.PrimaryKeyConstraint("hop_key"),
    )
    with op.batch_alter_table("hop_proofs", schema=None) as batch_op:
        batch_op.create_index("ix_hop_proofs_epoch", ["run_id", "epoch"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("hop_proofs", schema=None) as batch_op:
        batch_op.drop_index("ix_hop_proofs_epoch")
    op.drop_table("hop_proofs")

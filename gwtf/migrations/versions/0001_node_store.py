"""the node store: receipts, certificates, epochs, claims, slashes, challenges, peers

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-01 21:26:34.583921
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "certified_hops",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("worker_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("counterparty_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("certified_at", sa.Double(), nullable=False),
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
    with op.batch_alter_table("certified_hops", schema=None) as batch_op:
        batch_op.create_index("ix_certified_hops_epoch", ["run_id", "epoch"], unique=False)

    op.create_table(
        "challenges_seen",
        sa.Column("commitment", sa.LargeBinary(length=32), nullable=False),
        sa.Column("challenger", sa.String(length=42), nullable=False),
        sa.Column("accused", sa.String(length=42), nullable=True),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("seen_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("commitment"),
    )
    op.create_table(
        "countersignatures",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("signed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("hop_key"),
    )
    op.create_table(
        "epoch_certificates",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("data_node", sa.String(length=42), nullable=False),
        sa.Column("root", sa.LargeBinary(length=32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tx_hash", sa.LargeBinary(length=32), nullable=True),
        sa.Column("error", sa.String(length=400), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "epoch", "data_node"),
    )
    op.create_table(
        "peers",
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("node_address", sa.String(length=42), nullable=True),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("refusals", sa.BigInteger(), nullable=False),
        sa.Column("offences", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("peer_id"),
    )
    op.create_table(
        "reward_claims",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("data_node", sa.String(length=42), nullable=False),
        sa.Column("node", sa.String(length=42), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.Column("amount_wei", sa.String(length=78), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tx_hash", sa.LargeBinary(length=32), nullable=True),
        sa.Column("error", sa.String(length=400), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "epoch", "data_node", "node"),
    )
    op.create_table(
        "signed_hops",
        sa.Column("hop_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("receipt_digest", sa.LargeBinary(length=32), nullable=False),
        sa.Column("worker_signature", sa.LargeBinary(length=65), nullable=False),
        sa.Column("counterparty_signature", sa.LargeBinary(length=65), nullable=True),
        sa.Column("signed_at", sa.Double(), nullable=False),
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
    with op.batch_alter_table("signed_hops", schema=None) as batch_op:
        batch_op.create_index("ix_signed_hops_epoch", ["run_id", "epoch"], unique=False)

    op.create_table(
        "slashes",
        sa.Column("tx_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column("node", sa.String(length=42), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("fraud", sa.String(length=16), nullable=False),
        sa.Column("slashed_wei", sa.String(length=78), nullable=False),
        sa.Column("bounty_wei", sa.String(length=78), nullable=False),
        sa.Column("challenger", sa.String(length=42), nullable=False),
        sa.PrimaryKeyConstraint("tx_hash"),
    )


def downgrade() -> None:
    op.drop_table("slashes")
    with op.batch_alter_table("signed_hops", schema=None) as batch_op:
        batch_op.drop_index("ix_signed_hops_epoch")

    op.drop_table("signed_hops")
    op.drop_table("reward_claims")
    op.drop_table("peers")
    op.drop_table("epoch_certificates")
    op.drop_table("countersignatures")
    op.drop_table("challenges_seen")
    with op.batch_alter_table("certified_hops", schema=None) as batch_op:
        batch_op.drop_index("ix_certified_hops_epoch")

    op.drop_table("certified_hops")

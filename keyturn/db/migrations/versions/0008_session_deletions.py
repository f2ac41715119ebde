"""session deletions

The keys under which sessions were deleted, so that a deletion replays its
answer after the session is gone. Keyed per tenant.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-15 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_deletions",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column(
            "deleted_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tenant", "idempotency_key", name=op.f("pk_session_deletions")),
    )


def downgrade() -> None:
    op.drop_table("session_deletions")

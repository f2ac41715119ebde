"""queued turns by age: where the claim looks first

A partial index on the queued turns in the order they were admitted, so
that a claim finds the oldest heads of many sessions without reading every
queued turn (keyturn.db.leases).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-16 12:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_turns_queued_age",
        "turns",
        ["created_at", "admit_seq"],
        unique=False,
        postgresql_where=sa.text("status = 'QUEUED'"),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_queued_age", table_name="turns")

"""ix_turns_queued_age: read only by the claim's walk

Its predicate now adds a condition every turn meets (``status = 'QUEUED'
AND epoch >= 0``, the same rows: a turn's epoch starts at 0 and only
grows), and the claim's walk along it says so. Every other statement about queued turns
asks about one session, and ix_turns_queued answers that by a probe; with
statistics taken while nothing was queued both indexes cost the same, and
the planner took this one and read the whole queue for each session.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-19 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    _rebuild("status = 'QUEUED' AND epoch >= 0")


def downgrade() -> None:
    _rebuild("status = 'QUEUED'")


def _rebuild(where: str) -> None:
    op.drop_index("ix_turns_queued_age", table_name="turns")
    op.create_index(
        "ix_turns_queued_age",
        "turns",
        ["created_at", "admit_seq"],
        unique=False,
        postgresql_where=sa.text(where),
    )

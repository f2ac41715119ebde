"""approvals: where waiting turns and decision keys are found

A partial index on the turns that wait for a decision on a tool call (the
claim checks per session that none waits, and pendingApprovals lists them),
and a unique one on the keys of decisions (``tool.approved`` and
``tool.rejected`` events): a decision key names one decision in its session.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-15 13:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_turns_waiting",
        "turns",
        ["session_id"],
        unique=False,
        postgresql_where=sa.text("status = 'WAITING'"),
    )
    op.create_index(
        "ux_events_decision_key",
        "events",
        ["session_id", sa.text("(data ->> 'idempotencyKey')")],
        unique=True,
        postgresql_where=sa.text("type IN ('tool.approved', 'tool.rejected')"),
    )


def downgrade() -> None:
    op.drop_index("ux_events_decision_key", table_name="events")
    op.drop_index("ix_turns_waiting", table_name="turns")

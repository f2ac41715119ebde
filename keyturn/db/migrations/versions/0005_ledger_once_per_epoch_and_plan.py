"""one tool.planned per batch, ledger entries keyed by epoch

A ``tool.planned`` append retried after a lost answer must not append twice:
the unique index of the tool ledger now covers plans (keyed by the first
call's index) and names the epoch. Plans written before this carry no index
and stay outside it. Rebuilding the index locks the events table against
writes while it runs.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08 09:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _create(columns: list[str], types: str) -> None:
    op.create_index(
        "ux_events_tool_call",
        "events",
        ["turn_id", "type", *(sa.literal_column(c) for c in columns)],
        unique=True,
        postgresql_where=sa.text(f"type IN ({types})"),
    )


def upgrade() -> None:
    op.drop_index("ux_events_tool_call", table_name="events")
    _create(
        ["(data ->> 'index')", "(COALESCE(data ->> 'epoch', ''))"],
        "'tool.planned', 'tool.intent', 'tool.result', 'tool.reconciled'",
    )


def downgrade() -> None:
    op.drop_index("ux_events_tool_call", table_name="events")
    _create(["(data ->> 'index')"], "'tool.intent', 'tool.result', 'tool.reconciled'")

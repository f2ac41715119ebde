"""cancel and approval: the statuses CANCELLED and WAITING and their events

The CHECKs of 0004 (re-created by 0006) gain the new statuses and event
types, and the index where the retention sweeper finds ended turns counts a
cancelled turn as ended. Re-creating a CHECK scans its table under its lock,
within the migration's transaction.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-15 11:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

STATUSES = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "INTERRUPTED")
NEW_STATUSES = ("CANCELLED", "WAITING")
EVENT_TYPES = (
    "turn.started",
    "turn.running",
    "turn.completed",
    "turn.failed",
    "turn.interrupted",
    "turn.released",
    "turn.write_refused",
    "turn.retried",
    "turn.abandoned",
    "tool.planned",
    "tool.intent",
    "tool.result",
    "tool.reconciled",
    "turn.delta",
)
NEW_EVENT_TYPES = (
    "turn.cancel_requested",
    "turn.cancelled",
    "tool.approval_requested",
    "tool.approved",
    "tool.rejected",
)
ENDED = "status IN ('COMPLETED', 'FAILED', 'INTERRUPTED')"
ENDED_NOW = "status IN ('COMPLETED', 'FAILED', 'INTERRUPTED', 'CANCELLED')"


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(map(repr, values))})"


def _checks(statuses: tuple[str, ...], types: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_turns_status_known"), "turns", type_="check")
    op.create_check_constraint(op.f("ck_turns_status_known"), "turns", _in("status", statuses))
    op.drop_constraint(op.f("ck_events_type_known"), "events", type_="check")
    op.create_check_constraint(op.f("ck_events_type_known"), "events", _in("type", types))


def _ended(predicate: str) -> None:
    op.drop_index("ix_turns_ended", table_name="turns")
    op.create_index(
        "ix_turns_ended",
        "turns",
        ["completed_at"],
        unique=False,
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    _checks(STATUSES + NEW_STATUSES, EVENT_TYPES + NEW_EVENT_TYPES)
    _ended(ENDED_NOW)


def downgrade() -> None:
    # Fails while any turn or event uses the new values.
    _ended(ENDED)
    _checks(STATUSES, EVENT_TYPES)

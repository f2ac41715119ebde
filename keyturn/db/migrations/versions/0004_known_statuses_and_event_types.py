"""known statuses and event types

The database refuses a turn status or an event type that the code does not
know (keyturn.domain). Adding a CHECK scans the table under its lock, within
the migration's transaction: on a large record, start the new version while
traffic is low. A later migration that adds a value drops and re-creates the
constraint with the longer list (a migration test compares the two).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 08:40:00
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

STATUSES = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "INTERRUPTED")
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
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_check_constraint(op.f("ck_turns_status_known"), "turns", _in("status", STATUSES))
    op.create_check_constraint(op.f("ck_events_type_known"), "events", _in("type", EVENT_TYPES))


def downgrade() -> None:
    op.drop_constraint(op.f("ck_events_type_known"), "events", type_="check")
    op.drop_constraint(op.f("ck_turns_status_known"), "turns", type_="check")

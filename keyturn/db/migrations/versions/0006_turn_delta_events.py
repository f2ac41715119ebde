"""turn.delta events: a turn's output recorded while it streams

The events CHECK (0004) gains ``turn.delta``. Re-creating it scans the events
table under its lock, within the migration's transaction. A unique index
allows one delta per index of a turn's epoch, so a delta append retried after
a lost connection cannot append twice.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-15 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BEFORE = (
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
AFTER = (*BEFORE, "turn.delta")


def _check(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_events_type_known"), "events", type_="check")
    op.create_check_constraint(
        op.f("ck_events_type_known"), "events", f"type IN ({', '.join(map(repr, values))})"
    )


DELTA_INDEX = "ux_events_turn_delta"


def upgrade() -> None:
    _check(AFTER)
    op.create_index(
        DELTA_INDEX,
        "events",
        [
            "turn_id",
            sa.literal_column("(data ->> 'epoch')"),
            sa.literal_column("(data ->> 'index')"),
        ],
        unique=True,
        postgresql_where=sa.text("type = 'turn.delta'"),
    )


def downgrade() -> None:
    op.drop_index(DELTA_INDEX, table_name="events")
    # Fails while any turn.delta event exists: delete them first to go back.
    _check(BEFORE)

"""cancels and multitask: a turn's cancel, and what a busy session does

A turn holds its one cancel in four columns (when it was asked for, why, and
the key and fingerprint of cancelTurn); a cancel key is unique in its
session, like a turn's key. ``sessions.multitask`` is what a submission does
while the session has a turn queued or running. Every new column is
nullable or has a default, so adding them rewrites no table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-15 12:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

MULTITASK = ("ENQUEUE", "REJECT", "INTERRUPT")


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column("multitask", sa.Text(), server_default=sa.text("'ENQUEUE'"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_sessions_multitask_known"),
        "sessions",
        f"multitask IN ({', '.join(map(repr, MULTITASK))})",
    )
    op.add_column(
        "turns", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("turns", sa.Column("cancel_reason", sa.Text(), nullable=True))
    op.add_column("turns", sa.Column("cancel_key", sa.Text(), nullable=True))
    op.add_column("turns", sa.Column("cancel_fingerprint", sa.Text(), nullable=True))
    op.create_index(
        "ux_turns_cancel_key",
        "turns",
        ["session_id", "cancel_key"],
        unique=True,
        postgresql_where=sa.text("cancel_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ux_turns_cancel_key", table_name="turns")
    for column in ("cancel_fingerprint", "cancel_key", "cancel_reason", "cancel_requested_at"):
        op.drop_column("turns", column)
    op.drop_constraint(op.f("ck_sessions_multitask_known"), "sessions", type_="check")
    op.drop_column("sessions", "multitask")

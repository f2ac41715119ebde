"""key retention and tombstones

``key_tombstones`` keeps the key of a turn the retention sweeper pruned;
``ix_turns_ended`` is where the sweeper finds ended turns, oldest first; the
indexes on ``turns.retry_of`` and ``resolutions.new_turn_id`` let it delete a
turn, and ask whether a resolution names it, without scanning every row.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-15 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ENDED = "status IN ('COMPLETED', 'FAILED', 'INTERRUPTED')"


def upgrade() -> None:
    op.create_table(
        "key_tombstones",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "pruned_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_key_tombstones_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "idempotency_key", name=op.f("pk_key_tombstones")),
    )
    op.create_index("ix_key_tombstones_pruned_at", "key_tombstones", ["pruned_at"], unique=False)
    op.create_index(
        "ix_turns_ended",
        "turns",
        ["completed_at"],
        unique=False,
        postgresql_where=sa.text(ENDED),
    )
    op.create_index(
        "ix_turns_retry_of",
        "turns",
        ["retry_of"],
        unique=False,
        postgresql_where=sa.text("retry_of IS NOT NULL"),
    )
    op.create_index(
        "ix_resolutions_new_turn_id",
        "resolutions",
        ["new_turn_id"],
        unique=False,
        postgresql_where=sa.text("new_turn_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_resolutions_new_turn_id", table_name="resolutions")
    op.drop_index("ix_turns_retry_of", table_name="turns")
    op.drop_index("ix_turns_ended", table_name="turns", postgresql_where=sa.text(ENDED))
    op.drop_index("ix_key_tombstones_pruned_at", table_name="key_tombstones")
    op.drop_table("key_tombstones")

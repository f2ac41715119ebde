"""session_keys: one namespace of keys per session, decided by one primary key

Every key a request took (a submitted turn, a resolution, a cancel, a
decision on a tool call) gets a row here, inserted by the write that takes
it, so one unique index decides between kinds as it already did within one
kind. Filled from the record as it stands: a resolution's key first (a
RETRY's new turn carries it too), then turns' and pruned turns' keys, then
cancels' and decisions'. Should the record already hold one key twice, the
first in that order keeps it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-16 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_keys",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.CheckConstraint(
            "kind IN ('TURN', 'RESOLUTION', 'CANCEL', 'DECISION')",
            name="ck_session_keys_kind_known",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_session_keys_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "idempotency_key", name="pk_session_keys"),
    )
    op.create_index(
        "ix_session_keys_decided",
        "session_keys",
        ["turn_id"],
        unique=False,
        postgresql_where=sa.text("kind <> 'TURN'"),
    )
    op.execute(
        """
        INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
        SELECT session_id, idempotency_key, 'RESOLUTION', turn_id FROM resolutions
        UNION ALL
        SELECT session_id, idempotency_key, 'TURN', id FROM turns
        UNION ALL
        SELECT session_id, idempotency_key, 'TURN', turn_id FROM key_tombstones
        UNION ALL
        SELECT session_id, cancel_key, 'CANCEL', id FROM turns WHERE cancel_key IS NOT NULL
        UNION ALL
        SELECT session_id, data ->> 'idempotencyKey', 'DECISION', turn_id FROM events
        WHERE type IN ('tool.approved', 'tool.rejected') AND turn_id IS NOT NULL
          AND data ->> 'idempotencyKey' IS NOT NULL
        ON CONFLICT DO NOTHING
        """
    )


def downgrade() -> None:
    op.drop_index("ix_session_keys_decided", table_name="session_keys")
    op.drop_table("session_keys")

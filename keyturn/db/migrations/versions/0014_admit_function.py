"""keyturn_admit: a new key's admission inside the lookup's own statement

A submission is answered by one statement (keyturn.db.admission): the
lookup (the session, the turn its key names), and beside it this function,
which writes only when nothing holds the key, the session exists and the
submission's effective multitask policy is ENQUEUE. It reads before it
writes, so a replay locks nothing and writes nothing, where a statement
holding the writes itself would open every table and index it could write.
The writes are the admission statement's: the session row locked first,
the key claimed in session_keys (its primary key decides a race), the turn,
the session's counter, ``turn.started``. It returns the new turn, or no row.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-17 09:00:00
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_SIGNATURE = (
    "keyturn_admit(p_tenant text, p_session_id uuid, p_key text, p_turn_id uuid, "
    "p_input text, p_history text, p_multitask text, p_fp_full text, p_fp_none text)"
)


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {_SIGNATURE} RETURNS SETOF turns
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            s_history text;
            s_multitask text;
            eff_history text;
        BEGIN
            -- Whatever holds the key answers for it (a turn, a decision, a
            -- pruned turn's tombstone): the caller judges, nothing is written.
            PERFORM 1 FROM session_keys
            WHERE session_id = p_session_id AND idempotency_key = p_key;
            IF FOUND THEN
                RETURN;
            END IF;
            PERFORM 1 FROM key_tombstones
            WHERE session_id = p_session_id AND idempotency_key = p_key;
            IF FOUND THEN
                RETURN;
            END IF;
            SELECT default_history, multitask INTO s_history, s_multitask
            FROM sessions WHERE id = p_session_id AND tenant = p_tenant;
            -- REJECT and INTERRUPT read the session's turns under its lock,
            -- in a transaction of their own: the caller's.
            IF NOT FOUND OR COALESCE(p_multitask, s_multitask) <> 'ENQUEUE' THEN
                RETURN;
            END IF;
            eff_history := COALESCE(p_history, s_history);
            RETURN QUERY
            WITH s AS (
                SELECT id, event_seq FROM sessions
                WHERE id = p_session_id AND tenant = p_tenant FOR UPDATE
            ), k AS (
                INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
                SELECT s.id, p_key, 'TURN', p_turn_id FROM s
                ON CONFLICT DO NOTHING
                RETURNING session_id
            ), ins AS (
                INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input,
                                   history, status, admit_seq)
                SELECT p_turn_id, s.id, p_key,
                       CASE eff_history WHEN 'FULL' THEN p_fp_full ELSE p_fp_none END,
                       p_input, eff_history, 'QUEUED', s.event_seq + 1
                FROM s JOIN k ON k.session_id = s.id
                RETURNING *
            ), bump AS (
                UPDATE sessions SET event_seq = ins.admit_seq
                FROM ins WHERE sessions.id = ins.session_id
                RETURNING sessions.id, sessions.event_seq
            ), ev AS (
                INSERT INTO events (session_id, turn_id, seq, type, data)
                SELECT ins.session_id, ins.id, bump.event_seq, 'turn.started',
                       jsonb_build_object('idempotencyKey', p_key, 'history', eff_history,
                                          'seq', ins.admit_seq)
                FROM ins JOIN bump ON bump.id = ins.session_id
                RETURNING seq
            )
            SELECT ins.* FROM ins, ev;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {_SIGNATURE.split('(')[0]}")

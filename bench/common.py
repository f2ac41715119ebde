"""What the floor and the REST peer share: the admission SQL and the fingerprint.

Both are written against Keyturn's own tables (created by its migrations) and do
the same durable work Keyturn does: lock the session row, claim the key through
the primary key of ``session_keys`` (the session's one namespace of keys), insert the turn with
``admit_seq = event_seq + 1``, bump ``sessions.event_seq``, append
``turn.started``, commit (``synchronous_commit`` stays on). Nothing here imports
Keyturn: the peer is an independent implementation, and a test checks that its
fingerprint agrees with Keyturn's byte for byte.
"""

from __future__ import annotations

import hashlib
import unicodedata

MAX_KEY_CHARS = 255
MAX_INPUT_BYTES = 64 * 1024
HISTORIES = ("FULL", "NONE")

# The session and the key's turn, if any: a replay is answered from this alone.
LOOKUP = """
SELECT s.default_history, t.id, t.status, t.fingerprint, t.admit_seq
FROM sessions s
LEFT JOIN turns t ON t.session_id = s.id AND t.idempotency_key = $2
WHERE s.id = $1
"""

# One statement, one transaction, one round trip. The session row is locked
# first so seq stays gapless and commit-ordered; a key another transaction
# already claimed inserts nothing, so nothing is bumped or appended.
ADMIT = """
WITH s AS (
    SELECT id, event_seq FROM sessions WHERE id = $1 FOR UPDATE
), k AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT s.id, $2, 'TURN', $3 FROM s
    ON CONFLICT DO NOTHING
    RETURNING session_id
), ins AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history,
                       status, admit_seq)
    SELECT $3, s.id, $2, $4, $5, $6, 'QUEUED', s.event_seq + 1
    FROM s JOIN k ON k.session_id = s.id
    RETURNING id, session_id, status, admit_seq
), bump AS (
    UPDATE sessions SET event_seq = ins.admit_seq
    FROM ins WHERE sessions.id = ins.session_id
    RETURNING sessions.event_seq
), ev AS (
    INSERT INTO events (session_id, turn_id, seq, type, data)
    SELECT ins.session_id, ins.id, ins.admit_seq, 'turn.started',
           jsonb_build_object('idempotencyKey', $2::text, 'history', $6::text,
                              'seq', ins.admit_seq)
    FROM ins, bump
    RETURNING seq
)
SELECT ins.id, ins.status, ins.admit_seq FROM ins, ev
"""

# The winner of a lost race, read by a separate statement (a new snapshot).
BY_KEY = """
SELECT id, status, fingerprint, admit_seq FROM turns
WHERE session_id = $1 AND idempotency_key = $2
"""

EVENTS_AFTER = """
SELECT seq, type, data::text AS data FROM events
WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3
"""


def fingerprint(*, input: str, history: str) -> str:
    """sha256 over a version tag, the effective history and the input's exact bytes."""
    digest = hashlib.sha256()
    digest.update(b"keyturn/turn/v1\x00")
    digest.update(history.encode())
    digest.update(b"\x00")
    digest.update(input.encode("utf-8"))
    return digest.hexdigest()


def invalid_key(key: str) -> str | None:
    if key == "":
        return "Idempotency-Key must not be empty"
    if len(key) > MAX_KEY_CHARS:
        return f"Idempotency-Key must be at most {MAX_KEY_CHARS} characters"
    if any(unicodedata.category(ch) == "Cc" for ch in key):
        return "Idempotency-Key must not contain control characters"
    return None


def invalid_input(text: str) -> str | None:
    if text == "":
        return "input must not be empty"
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return "input is not valid Unicode text"
    if len(raw) > MAX_INPUT_BYTES:
        return f"input must be at most {MAX_INPUT_BYTES} bytes of UTF-8"
    if "\x00" in text:
        return "input must not contain the NUL character"
    return None

"""What the rows start from, written straight into a target's database: empty
sessions for the admission rows, one session already holding every event the
reading rows page through, and a backlog of long-ended turns for the
retention row (and the retention tests)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.sizes import Config
from keyturn.ops.databases import admin_connect


async def make_sessions(url: str, count: int, history: str) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    conn = await admin_connect(url)
    try:
        await conn.executemany(
            "INSERT INTO sessions (id, default_history) VALUES ($1, $2)",
            [(uuid.UUID(i), history) for i in ids],
        )
    finally:
        await conn.close()
    return ids


def session_files(cfg: Config, urls: dict[str, str], tmp: Path) -> dict[tuple[str, str], Path]:
    """For each target and scope, a file of new session ids, one a line (what
    wrk's script and the floor read): ``cfg.sessions`` of them, or one hot one."""
    files: dict[tuple[str, str], Path] = {}
    for target, url in urls.items():
        for scope, count in (("many", cfg.sessions), ("hot", 1)):
            ids = asyncio.run(make_sessions(url, count, cfg.history))
            path = tmp / f"{target}-{scope}.txt"
            path.write_text("\n".join(ids) + "\n")
            files[target, scope] = path
    return files


async def make_event_session(url: str, events: int, history: str) -> str:
    """A session holding ``events`` events (written directly: admission is not what f measures)."""
    sid = uuid.uuid4()
    conn = await admin_connect(url)
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO sessions (id, default_history, event_seq) VALUES ($1, $2, $3)",
                sid,
                history,
                events,
            )
            await conn.execute(
                """INSERT INTO events (session_id, seq, type, data)
                   SELECT $1, g, 'turn.started',
                          jsonb_build_object('idempotencyKey', 'key-' || g,
                                             'history', $2::text, 'seq', g)
                   FROM generate_series(1, $3::bigint) g""",
                sid,
                history,
                events,
            )
        await conn.execute("ANALYZE events")
    finally:
        await conn.close()
    return str(sid)


# Sessions of COMPLETED turns, three events each, the n-th turn of a session
# ended n seconds after the first, as a year of traffic would leave them.
_BACKLOG = """
WITH s AS (
    INSERT INTO sessions (id, default_history, tenant, event_seq)
    SELECT gen_random_uuid(), $4, '', $2 * 3 FROM generate_series(1, $1)
    RETURNING id
), t AS (
    INSERT INTO turns (id, session_id, idempotency_key, fingerprint, input, history, status,
                       output, admit_seq, created_at, started_at, completed_at, epoch)
    SELECT gen_random_uuid(), s.id, 'old-' || n, 'fp-' || n, 'input ' || n, $4, 'COMPLETED',
           'output ' || n, 3 * n - 2, now() - $3::interval, now() - $3::interval,
           now() - $3::interval + make_interval(secs => n), 1
    FROM s, generate_series(1, $2) n
    RETURNING id, session_id, idempotency_key, admit_seq
), sk AS (
    INSERT INTO session_keys (session_id, idempotency_key, kind, turn_id)
    SELECT session_id, idempotency_key, 'TURN', id FROM t
)
INSERT INTO events (session_id, turn_id, seq, type, data)
SELECT t.session_id, t.id, t.admit_seq + k,
       (ARRAY['turn.started', 'turn.running', 'turn.completed'])[k + 1],
       jsonb_build_object('epoch', 1, 'output', 'output')
FROM t, generate_series(0, 2) k
"""


async def seed_backlog(
    conn: Any,
    *,
    sessions: int,
    turns_per_session: int,
    ended_ago: timedelta,
    history: str = "FULL",
) -> None:
    """``sessions`` sessions of ``turns_per_session`` COMPLETED turns each
    (keys ``old-N``, fingerprints ``fp-N``), ended about ``ended_ago`` ago."""
    await conn.execute(_BACKLOG, sessions, turns_per_session, ended_ago, history)

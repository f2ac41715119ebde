"""What the rows start from, written straight into a target's database: empty
sessions for the admission rows, and one session already holding every event
the reading rows page through."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

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

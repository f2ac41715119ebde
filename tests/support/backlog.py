"""A backlog of long-ended turns written straight into the record, as a year
of traffic would leave it: sessions of completed turns, three events each."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from bench import seed


async def seed_backlog(
    db: Any, *, sessions: int, turns_per_session: int, ended_ago: timedelta
) -> None:
    """``sessions`` sessions of ``turns_per_session`` COMPLETED turns each,
    ended about ``ended_ago`` ago (the n-th turn of a session n seconds later)."""
    await seed.seed_backlog(
        db, sessions=sessions, turns_per_session=turns_per_session, ended_ago=ended_ago
    )


async def assert_backlog_pruned(db: Any, *, turns: int, events: int) -> None:
    """The record after one clean pass of a one-hour key retention over the
    whole backlog: a tombstone per turn, every event kept and blanked, every
    session's seq still 1..n."""
    remaining = await db.fetchrow(
        "SELECT (SELECT count(*) FROM turns) AS t, (SELECT count(*) FROM events) AS e, "
        "(SELECT count(*) FROM key_tombstones) AS k"
    )
    assert (remaining["t"], remaining["e"], remaining["k"]) == (0, events, turns)
    blanked = await db.fetchval(
        "SELECT count(*) FROM events WHERE turn_id IS NULL AND data = '{\"pruned\": true}'"
    )
    assert blanked == events
    gaps = await db.fetchval(
        "SELECT count(*) FROM (SELECT session_id, count(*) AS n, max(seq) AS top, "
        "min(seq) AS low FROM events GROUP BY session_id) s WHERE n <> top OR low <> 1"
    )
    assert gaps == 0
    # Each tombstone is its turn's: key and fingerprint match (old-N, fp-N),
    # and the key expired an hour after the turn ended.
    stones = await db.fetchval(
        "SELECT count(*) FROM key_tombstones WHERE idempotency_key = 'old-' || "
        "substr(fingerprint, 4) AND expired_at = ended_at + interval '1 hour'"
    )
    assert stones == turns

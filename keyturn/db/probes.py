"""What operations ask of the database: is it there, what is it, what does it hold.

For ``/readyz``, ``/metrics`` and ``keyturn doctor``; none of these writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from keyturn.db.engine import Conn
from keyturn.db.sql import Statement

_PING = Statement("SELECT 1")
_TURNS_BY_STATUS = Statement("SELECT status, count(*) AS n FROM turns GROUP BY status")
_FACTS = Statement(
    "SELECT current_setting('server_version_num')::int AS version_num, "
    "current_setting('server_version') AS version, "
    "current_setting('synchronous_commit') AS synchronous_commit"
)
_CLOCK = Statement("SELECT extract(epoch FROM clock_timestamp())::float8")


@dataclass(frozen=True, slots=True)
class ServerFacts:
    version_num: int
    version: str
    synchronous_commit: str
    # The database's clock minus this process's, at the midpoint of a round trip.
    clock_skew_s: float


async def ping(conn: Conn) -> None:
    await _PING.fetchval(conn)


async def turns_by_status(conn: Conn) -> dict[str, int]:
    return {str(r["status"]): int(r["n"]) for r in await _TURNS_BY_STATUS.fetch(conn)}


async def server_facts(conn: Conn) -> ServerFacts:
    row = await _FACTS.fetchrow(conn)
    assert row is not None  # a SELECT without FROM returns its one row
    before = time.time()
    db_now = float(await _CLOCK.fetchval(conn))
    after = time.time()
    return ServerFacts(
        version_num=int(row["version_num"]),
        version=str(row["version"]),
        synchronous_commit=str(row["synchronous_commit"]),
        clock_skew_s=db_now - (before + after) / 2,
    )

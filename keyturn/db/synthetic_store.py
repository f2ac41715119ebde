"""The synthetic tools' external store: a table that is not the runtime's record.

The tools write it on their own connections, in their own transactions, so a
crash between a write here and the ledger entry that records it is possible
and can be observed. Rows are keyed by effect key.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from keyturn.db.engine import Conn
from keyturn.db.sql import Statement


class Write(Enum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"  # the idempotent key was applied before
    SETTLED_NOT_APPLIED = "settled_not_applied"  # a check settled the key as never applied


_WRITE_IDEMPOTENT = Statement(
    """
    INSERT INTO synthetic_effects (effect_key, tool, idempotent, applied, name, value)
    VALUES (:key, :tool, true, true, :name, :value)
    ON CONFLICT (effect_key) WHERE idempotent DO NOTHING
    RETURNING id
    """
)
_WRITE_UNSAFE = Statement(
    """
    INSERT INTO synthetic_effects (effect_key, tool, idempotent, applied, name, value)
    VALUES (:key, :tool, false, true, :name, :value)
    """
)
# Asking about a key that was not applied claims it as "never": a write with
# that key arriving later (from a process that hung, not died) does nothing.
_SETTLE = Statement(
    """
    INSERT INTO synthetic_effects (effect_key, tool, idempotent, applied)
    VALUES (:key, :tool, true, false)
    ON CONFLICT (effect_key) WHERE idempotent DO NOTHING
    """
)
_IDEMPOTENT_STATE = Statement(
    "SELECT applied FROM synthetic_effects WHERE effect_key = :key AND idempotent"
)
_LATEST = Statement(
    "SELECT value FROM synthetic_effects WHERE name = :name AND applied ORDER BY id DESC LIMIT 1"
)
_APPLIED_COUNTS = Statement(
    "SELECT effect_key, count(*) FILTER (WHERE applied) AS n FROM synthetic_effects "
    "WHERE effect_key = ANY(:keys) GROUP BY effect_key"
)
_ANSWERED = Statement(
    "SELECT effect_key FROM synthetic_effects WHERE effect_key = ANY(:keys) AND idempotent"
)


async def write(
    conn: Conn, *, key: str, tool: str, idempotent: bool, name: str, value: str
) -> Write:
    if not idempotent:
        await _WRITE_UNSAFE.execute(conn, key=key, tool=tool, name=name, value=value)
        return Write.APPLIED
    if await _WRITE_IDEMPOTENT.fetchval(conn, key=key, tool=tool, name=name, value=value):
        return Write.APPLIED
    applied = await _IDEMPOTENT_STATE.fetchval(conn, key=key)
    return Write.ALREADY_APPLIED if applied else Write.SETTLED_NOT_APPLIED


async def settle(conn: Conn, *, key: str, tool: str) -> bool:
    """Was the idempotent effect ``key`` applied? A "no" is final."""
    await _SETTLE.execute(conn, key=key, tool=tool)
    return bool(await _IDEMPOTENT_STATE.fetchval(conn, key=key))


async def latest(conn: Conn, *, name: str) -> str | None:
    value = await _LATEST.fetchval(conn, name=name)
    return str(value) if value is not None else None


async def applied_counts(conn: Conn, *, keys: Sequence[str]) -> dict[str, int]:
    """How many times each effect key was applied (absent keys: 0)."""
    rows = await _APPLIED_COUNTS.fetch(conn, keys=list(keys))
    counts = {k: 0 for k in keys}
    counts.update({r["effect_key"]: int(r["n"]) for r in rows})
    return counts


async def answered(conn: Conn, *, keys: Sequence[str]) -> set[str]:
    """The idempotent keys the store has an answer for: applied, or settled
    as never applied by a question."""
    return {str(r["effect_key"]) for r in await _ANSWERED.fetch(conn, keys=list(keys))}

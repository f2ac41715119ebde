"""Moving a session between Keyturns: ``keyturn export`` writes its record as
JSON Lines, ``keyturn import`` loads it into another database, ids, seq,
keys and fingerprints kept, so that a retry there answers as it would here.

The file, one JSON object a line, each with its ``kind``::

    {"kind": "keyturn.session", "version": 1, "sessionId": "…"}
    {"kind": "session", …the session's columns…}
    {"kind": "turn", …}        one a line, in admission order
    {"kind": "event", …}       one a line, in seq order (the tool ledger too)
    {"kind": "resolution", …}
    {"kind": "tombstone", …}   the keys of pruned turns
    {"kind": "end", "turn": N, "event": N, "resolution": N, "tombstone": N}

The last line's counts let an import tell a whole file from a cut one.
Export streams (a server-side cursor, a line written as it is read); import
reads a line at a time and writes in batches, all in one transaction: a file
that is refused anywhere leaves nothing behind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

import orjson

from keyturn.db import keys
from keyturn.db import transfer as db
from keyturn.db.engine import Conn, Engine, connect
from keyturn.errors import TransferRefused

FORMAT = "keyturn.session"
VERSION = 1
BATCH = 500
_PART_OF = {p.kind: p for p in db.PARTS}


class Progress:
    """A carriage-return line on a terminal (``lines done/total``), nothing
    elsewhere: a pipe or a log file gets only the summary."""

    def __init__(self, stream: IO[str] | None, label: str, *, every_s: float = 0.2) -> None:
        self._stream = stream if stream is not None and stream.isatty() else None
        self._label = label
        self._every_s = every_s
        self._last = 0.0
        self.total: int | None = None
        self.done = 0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self._stream is not None and now - self._last >= self._every_s:
            self._last = now
            self._draw()

    def _draw(self) -> None:
        assert self._stream is not None
        of = f"/{self.total}" if self.total is not None else ""
        self._stream.write(f"\r{self._label}: {self.done}{of} lines")
        self._stream.flush()

    def finish(self) -> None:
        if self._stream is not None:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()


@dataclass(frozen=True, slots=True)
class Transferred:
    session_id: uuid.UUID
    counts: dict[str, int]  # rows per kind
    already_present: bool = False  # import: the same record was here; nothing written

    def describe(self) -> str:
        return ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in self.counts.items())


def _line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


# -- export -----------------------------------------------------------------------
async def export_session(
    engine: Engine,
    *,
    tenant: str,
    session_id: uuid.UUID,
    out: IO[bytes],
    progress: Progress | None = None,
) -> Transferred:
    """Write the session's record to ``out``; TransferRefused (nothing
    written) for a session that is not there or has a turn running."""
    async with connect(engine) as conn, db.one_snapshot(conn):
        snap = await db.snapshot(conn, tenant=tenant, session_id=session_id)
        if snap is None:
            raise TransferRefused(
                f"no session {session_id} in tenant {tenant!r} (name its tenant with --tenant)"
            )
        if snap.running_turn_id is not None:
            raise TransferRefused(
                f"session {session_id} has a RUNNING turn ({snap.running_turn_id}); "
                "export it once the turn has ended"
            )
        if progress is not None:
            progress.total = sum(snap.counts.values()) + 3
        out.write(_line({"kind": FORMAT, "version": VERSION, "sessionId": str(session_id)}))
        out.write(_line({"kind": db.SESSION.kind, **snap.session}))
        for part in db.PARTS:
            async for record in db.rows(conn, part, session_id=session_id):
                out.write(_line({"kind": part.kind, **record}))
                if progress is not None:
                    progress.advance()
        out.write(_line({"kind": "end", **snap.counts}))
    if progress is not None:
        progress.advance(3)
        progress.finish()
    return Transferred(session_id, snap.counts)


# -- import -----------------------------------------------------------------------
class _Lines:
    """The file's lines as JSON objects, numbered for messages."""

    def __init__(self, lines: Iterable[bytes]) -> None:
        self._lines = iter(lines)
        self.number = 0

    def next(self) -> dict[str, Any] | None:
        for raw in self._lines:
            self.number += 1
            if not raw.strip():
                raise self.refused("is empty")
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise self.refused("is not JSON") from None
            if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
                raise self.refused('is not a JSON object with a "kind"')
            return value
        return None

    def refused(self, why: str) -> TransferRefused:
        return TransferRefused(f"line {self.number} {why}")


async def import_session(
    engine: Engine,
    *,
    lines: Iterable[bytes],
    tenant: str | None = None,
    progress: Progress | None = None,
) -> Transferred:
    """Load an exported session (into ``tenant``, else the file's own).

    The same record already here is a no-op (``already_present``). Anything
    else that is already here (the session with another record, a turn id
    of another session) or wrong with the file refuses the whole import:
    TransferRefused naming the line, nothing written."""
    file = _Lines(lines)
    header = file.next()
    if header is None or header.get("kind") != FORMAT:
        raise TransferRefused(f"not a Keyturn session export (its first line names {FORMAT!r})")
    if header.get("version") != VERSION:
        raise TransferRefused(
            f"export format version {header.get('version')!r}; this Keyturn reads {VERSION}"
        )
    first = file.next()
    if first is None or first.get("kind") != db.SESSION.kind:
        raise file.refused("should be the session")
    try:
        session = db.decode(db.SESSION, first)
    except TransferRefused as error:
        raise file.refused(f"is not a valid session: {error}") from None
    if tenant is not None:
        session["tenant"] = tenant
    sid: uuid.UUID = session["id"]
    if str(sid) != header.get("sessionId"):
        raise file.refused("names another session than the first line")
    async with connect(engine) as conn, conn.driver.transaction():
        return await _load(conn, file, session, progress)


async def _load(
    conn: Conn, file: _Lines, session: dict[str, Any], progress: Progress | None
) -> Transferred:
    sid: uuid.UUID = session["id"]
    existing = await db.lock_session(conn, session_id=sid)
    present = existing is not None
    if existing is not None:
        mine = db.canonical(db.SESSION, session)
        for name in db.SESSION.columns:
            if mine[name] != existing[name]:
                raise TransferRefused(
                    f"session {sid} already exists here with another record ({name} differs)"
                )
    else:
        await db.insert_session(conn, session)
    counts = {p.kind: 0 for p in db.PARTS}
    batch: list[dict[str, Any]] = []
    part: db.Part | None = None
    order = [p.kind for p in db.PARTS]

    async def flush() -> None:
        if not batch or part is None:
            return
        if present:
            why = await db.differing(conn, part, session_id=sid, records=batch)
            if why is not None:
                raise TransferRefused(
                    f"session {sid} already exists here with another record ({why})"
                )
        else:
            await db.insert(conn, part, batch)
        batch.clear()

    while True:
        raw = file.next()
        if raw is None:
            raise TransferRefused(
                f"the file ends at line {file.number} without its last line (cut short?)"
            )
        kind = raw["kind"]
        if kind == "end":
            break
        found = _PART_OF.get(kind)
        if found is None:
            raise file.refused(f"has an unknown kind {kind!r}")
        if part is not None and order.index(kind) < order.index(part.kind):
            raise file.refused(f"is a {kind} after the {part.kind}s")
        try:
            record = db.decode(found, raw)
        except TransferRefused as error:
            raise file.refused(f"is not a valid {kind}: {error}") from None
        if record[found.session_column] != sid:
            raise file.refused(f"is a {kind} of another session")
        if found is not part or len(batch) >= BATCH:
            await flush()
            part = found
        batch.append(record)
        counts[kind] += 1
        if progress is not None:
            progress.advance()
    await flush()
    declared = {p.kind: raw.get(p.kind) for p in db.PARTS}
    if declared != counts:
        raise file.refused(f"counts {declared}, but the file holds {counts}")
    if present:
        here = await db.counts(conn, session_id=sid)
        if here != counts:
            raise TransferRefused(
                f"session {sid} already exists here with another record (here: {here})"
            )
    else:
        wrong = await db.check_imported(conn, session_id=sid, event_seq=session["event_seq"])
        if wrong is not None:
            raise TransferRefused(wrong)
        # The keys are derived from the record, not carried in the file.
        await keys.rebuild(conn, session_id=sid)
    if progress is not None:
        progress.finish()
    return Transferred(sid, counts, already_present=present)

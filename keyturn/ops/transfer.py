"""Moving sessions between Keyturns: ``keyturn export`` writes the record
of one session, or of every session of a tenant, as JSON Lines; ``keyturn
import`` loads it into another database, ids, seq, keys and fingerprints
kept, so that a retry there answers as it would here.

The file, one JSON object a line, each with its ``kind``::

    {"kind": "keyturn.export", "version": 2, "tenant": "…", "sessions": N}
    then, for each of the N sessions, oldest first:
    {"kind": "session", …the session's columns…}
    {"kind": "turn", …}        one a line, in admission order
    {"kind": "event", …}       one a line, in seq order (the tool ledger too)
    {"kind": "resolution", …}
    {"kind": "tombstone", …}   the keys of pruned turns
    {"kind": "key", "key_kind": "CANCEL", …}   every key its requests took
    {"kind": "end", "turn": N, "event": N, "resolution": N, "tombstone": N, "key": N}

The header's count of sessions and each session's last line with its counts
let an import tell a whole file from a cut one. A file of version 1 (one
session, under a ``{"kind": "keyturn.session", "version": 1, "sessionId":
"…"}`` header, without its keys) is still read: its keys are rebuilt from
its record, which holds all of them but those of a pruned turn's cancel
and decisions.

Export streams (one snapshot, server-side cursors, a line written as it is
read); import reads a line at a time and writes in batches, the whole file
in one transaction: a file that is refused anywhere leaves nothing behind.
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

FORMAT = "keyturn.export"
VERSION = 2
FORMAT_V1 = "keyturn.session"  # one session, without its keys; still read
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
        self._drawn = False
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
        self._drawn = True

    def finish(self) -> None:
        if self._stream is not None:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()

    def stop(self) -> None:
        """Given up: end the line drawn so far, if any, so that the reason
        printed next has a line of its own."""
        if self._stream is not None and self._drawn:
            self._stream.write("\n")
            self._stream.flush()


@dataclass(frozen=True, slots=True)
class Transferred:
    """One session of a file: the rows it holds, per part."""

    session_id: uuid.UUID
    counts: dict[str, int]  # rows per kind
    already_present: bool = False  # import: the same record was here; nothing written

    def describe(self) -> str:
        return _describe(self.counts)


@dataclass(frozen=True, slots=True)
class Moved:
    """A whole file: its sessions in the file's order."""

    sessions: list[Transferred]

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for one in self.sessions:
            for kind, n in one.counts.items():
                out[kind] = out.get(kind, 0) + n
        return out

    def describe(self) -> str:
        n = len(self.sessions)
        return f"{n} session{'' if n == 1 else 's'}, {_describe(self.totals())}"


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in counts.items())


def _line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


# -- export -----------------------------------------------------------------------
async def export(
    engine: Engine,
    *,
    tenant: str,
    session_id: uuid.UUID | None = None,
    out: IO[bytes],
    progress: Progress | None = None,
) -> Moved:
    """Write the record of the tenant's session ``session_id``, or of every
    session of the tenant, to ``out``: TransferRefused (nothing written)
    when there is no such session, or one of them has a turn running."""
    async with connect(engine) as conn, db.one_snapshot(conn):
        scope = await db.scope(conn, tenant=tenant, session_id=session_id)
        if scope.sessions == 0:
            raise TransferRefused(
                f"no session {session_id} in tenant {tenant!r} (name its tenant with --tenant)"
                if session_id is not None
                else f"no sessions in tenant {tenant!r} (`keyturn token list` shows the tenants)"
            )
        if scope.running is not None:
            busy, turn = scope.running
            raise TransferRefused(
                f"session {busy} has a RUNNING turn ({turn}); export it once the turn has ended"
            )
        if progress is not None:
            # The header, and each session's first and last lines.
            progress.total = sum(scope.counts.values()) + 2 * scope.sessions + 1
        out.write(
            _line(
                {"kind": FORMAT, "version": VERSION, "tenant": tenant, "sessions": scope.sessions}
            )
        )
        done: list[Transferred] = []
        async for session in db.sessions(conn, tenant=tenant, session_id=session_id):
            sid = uuid.UUID(session["id"])
            out.write(_line({"kind": db.SESSION.kind, **session}))
            counts: dict[str, int] = {}
            for part in db.parts(VERSION):
                counts[part.kind] = 0
                async for record in db.rows(conn, part, session_id=sid):
                    out.write(_line({"kind": part.kind, **record}))
                    counts[part.kind] += 1
                    if progress is not None:
                        progress.advance()
            out.write(_line({"kind": "end", **counts}))
            if progress is not None:
                progress.advance(2)
            done.append(Transferred(sid, counts))
    if progress is not None:
        progress.advance()
        progress.finish()
    return Moved(done)


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


@dataclass(frozen=True, slots=True)
class _Header:
    version: int
    sessions: int
    session_id: str | None  # version 1 names its one session


def _header(file: _Lines) -> _Header:
    header = file.next()
    kind = header.get("kind") if header is not None else None
    if header is None or kind not in (FORMAT, FORMAT_V1):
        raise TransferRefused(f"not a Keyturn export (its first line names {FORMAT!r})")
    version = header.get("version")
    if (kind, version) == (FORMAT_V1, 1):
        return _Header(1, 1, header.get("sessionId"))
    if (kind, version) != (FORMAT, VERSION):
        raise TransferRefused(
            f"export format version {version!r}; this Keyturn reads {VERSION} (and 1)"
        )
    sessions = header.get("sessions")
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise file.refused("should count the file's sessions (a whole number, at least 1)")
    return _Header(VERSION, sessions, None)


async def import_file(
    engine: Engine,
    *,
    lines: Iterable[bytes],
    tenant: str | None = None,
    progress: Progress | None = None,
) -> Moved:
    """Load an export (each session into ``tenant``, else its own), in one
    transaction.

    A session whose same record is already here is a no-op
    (``already_present``). Anything else that is already here (the session
    with another record, a turn id of another session) or wrong with the
    file refuses the whole file: TransferRefused naming the line, nothing
    written, whichever session it is in."""
    file = _Lines(lines)
    header = _header(file)
    done: list[Transferred] = []
    async with connect(engine) as conn, conn.driver.transaction():
        seen: set[uuid.UUID] = set()
        while len(done) < header.sessions:
            first = file.next()
            if first is None:
                raise TransferRefused(
                    f"the file ends at line {file.number} after {len(done)} of its "
                    f"{header.sessions} sessions (cut short?)"
                )
            if first.get("kind") != db.SESSION.kind:
                raise file.refused("should be a session")
            try:
                session = db.decode(db.SESSION, first)
            except TransferRefused as error:
                raise file.refused(f"is not a valid session: {error}") from None
            if tenant is not None:
                session["tenant"] = tenant
            sid: uuid.UUID = session["id"]
            if header.session_id is not None and str(sid) != header.session_id:
                raise file.refused("names another session than the first line")
            if sid in seen:
                raise file.refused(f"is session {sid} again")
            seen.add(sid)
            done.append(await _load(conn, file, session, header.version, progress))
        if file.next() is not None:
            raise file.refused(f"follows the last of the file's {header.sessions} sessions")
    if progress is not None:
        progress.finish()
    return Moved(done)


async def _load(
    conn: Conn, file: _Lines, session: dict[str, Any], version: int, progress: Progress | None
) -> Transferred:
    sid: uuid.UUID = session["id"]
    carried = db.parts(version)
    existing = await db.lock_session(conn, session_id=sid)
    present = existing is not None
    if existing is not None:
        mine = db.canonical(db.SESSION, session)
        for name in db.SESSION.fields:
            if mine[name] != existing[name]:
                raise TransferRefused(
                    f"session {sid} already exists here with another record ({name} differs)"
                )
    else:
        await db.insert_session(conn, session)
    if progress is not None:
        progress.advance()
    counts = {p.kind: 0 for p in carried}
    batch: list[dict[str, Any]] = []
    part: db.Part | None = None
    order = [p.kind for p in carried]

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
        if found is None or found not in carried:
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
    if progress is not None:
        progress.advance()
    declared = {k: v for k, v in raw.items() if k != "kind"}
    if declared != counts:
        raise file.refused(f"counts {declared}, but the file holds {counts}")
    if present:
        here = await db.counts(conn, session_id=sid, of=carried)
        if here != counts:
            raise TransferRefused(
                f"session {sid} already exists here with another record (here: {here})"
            )
        return Transferred(sid, counts, already_present=True)
    wrong = await db.check_imported(conn, session_id=sid, event_seq=session["event_seq"])
    if wrong is None:
        if "key" in counts:
            wrong = await keys.disagreement(conn, session_id=sid)
        else:
            # A file from before keys were carried: they come from the record.
            await keys.rebuild(conn, session_id=sid)
    if wrong is not None:
        raise TransferRefused(f"session {sid}: {wrong}")
    return Transferred(sid, counts)

"""Reads of the record for the API: sessions, turns, events, tool calls.

A façade with no state but the engine: each read checks out a connection,
runs the queries of :mod:`keyturn.db.reads` and hands up plain records.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from keyturn.db import reads
from keyturn.db.engine import Engine, connect
from keyturn.db.records import EventRecord, SessionRecord, TurnRecord


class Reads:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def session(self, session_id: uuid.UUID, *, tenant: str) -> SessionRecord | None:
        async with connect(self.engine) as conn:
            return await reads.session(conn, tenant=tenant, session_id=session_id)

    async def session_with_events(
        self, session_id: uuid.UUID, *, tenant: str, after: int, limit: int, lean: bool = False
    ) -> tuple[SessionRecord | None, list[EventRecord]]:
        """:meth:`session` and :meth:`events` in one statement: a page read
        that asks for both makes one round trip, not two. ``lean``: see
        keyturn.db.reads.session_with_events."""
        async with connect(self.engine) as conn:
            return await reads.session_with_events(
                conn, tenant=tenant, session_id=session_id, after=after, limit=limit, lean=lean
            )

    async def sessions(
        self,
        *,
        tenant: str,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        count: bool = True,
    ) -> tuple[list[SessionRecord], int]:
        """A page of the tenant's sessions, and their count (0 unless ``count``)."""
        async with connect(self.engine) as conn:
            page = await reads.sessions_after(conn, tenant=tenant, after=after, limit=limit)
            return page, await reads.session_count(conn, tenant=tenant) if count else 0

    async def turn(self, turn_id: uuid.UUID, *, tenant: str) -> TurnRecord | None:
        async with connect(self.engine) as conn:
            return await reads.turn(conn, tenant=tenant, turn_id=turn_id)

    async def turns(
        self, *, session_id: uuid.UUID, after: int, limit: int
    ) -> tuple[list[TurnRecord], int]:
        """A session's turns (the session was looked up under the caller's tenant)."""
        async with connect(self.engine) as conn:
            page = await reads.turns_after(conn, session_id=session_id, after=after, limit=limit)
            return page, await reads.turn_count(conn, session_id=session_id)

    async def turns_before(
        self, *, session_id: uuid.UUID, before: int, limit: int
    ) -> tuple[list[TurnRecord], int]:
        """The turns just before ``before``, latest first, and the session's count."""
        async with connect(self.engine) as conn:
            page = await reads.turns_before(conn, session_id=session_id, before=before, limit=limit)
            return page, await reads.turn_count(conn, session_id=session_id)

    async def turns_batch(
        self, *, session_ids: Sequence[uuid.UUID], after: int, limit: int
    ) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
        """:meth:`turns` for many sessions in one statement."""
        async with connect(self.engine) as conn:
            return await reads.turns_after_batch(
                conn, session_ids=session_ids, after=after, limit=limit
            )

    async def turns_before_batch(
        self, *, session_ids: Sequence[uuid.UUID], before: int, limit: int
    ) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
        """:meth:`turns_before` for many sessions in one statement."""
        async with connect(self.engine) as conn:
            return await reads.turns_before_batch(
                conn, session_ids=session_ids, before=before, limit=limit
            )

    async def events(self, *, session_id: uuid.UUID, after: int, limit: int) -> list[EventRecord]:
        """A page of a session's events for an answer: each one's data is its
        JSON text (keyturn.db.reads.RawJSON), passed on as it is."""
        async with connect(self.engine) as conn:
            return await reads.events_after(
                conn, session_id=session_id, after=after, limit=limit, raw_data=True
            )

    async def events_before(
        self, *, session_id: uuid.UUID, before: int, limit: int
    ) -> list[EventRecord]:
        """The events just before seq ``before``, latest first; data as for :meth:`events`."""
        async with connect(self.engine) as conn:
            return await reads.events_before(
                conn, session_id=session_id, before=before, limit=limit, raw_data=True
            )

    async def events_batch(
        self, *, session_ids: Sequence[uuid.UUID], after: int, limit: int
    ) -> dict[uuid.UUID, list[EventRecord]]:
        """:meth:`events` for many sessions in one statement."""
        async with connect(self.engine) as conn:
            return await reads.events_after_batch(
                conn, session_ids=session_ids, after=after, limit=limit
            )

    async def events_before_batch(
        self, *, session_ids: Sequence[uuid.UUID], before: int, limit: int
    ) -> dict[uuid.UUID, list[EventRecord]]:
        """:meth:`events_before` for many sessions in one statement."""
        async with connect(self.engine) as conn:
            return await reads.events_before_batch(
                conn, session_ids=session_ids, before=before, limit=limit
            )

    async def nodes(
        self, *, tenant: str, uuids: Sequence[uuid.UUID], numbers: Sequence[int]
    ) -> dict[uuid.UUID | int, SessionRecord | TurnRecord | EventRecord]:
        """The tenant's sessions and turns among ``uuids`` and its events among
        ``numbers``, by id (others are absent): one statement per kind asked for."""
        found: dict[uuid.UUID | int, SessionRecord | TurnRecord | EventRecord] = {}
        async with connect(self.engine) as conn:
            if uuids:
                sessions = await reads.sessions_by_id(conn, tenant=tenant, session_ids=uuids)
                found.update(sessions.items())
                rest = [u for u in uuids if u not in sessions]
                if rest:
                    turns = await reads.turns_by_id(conn, tenant=tenant, turn_ids=rest)
                    found.update(turns.items())
            if numbers:
                events = await reads.events_by_id(conn, tenant=tenant, event_ids=numbers)
                found.update(events.items())
        return found

    async def event(self, event_id: int, *, tenant: str) -> EventRecord | None:
        async with connect(self.engine) as conn:
            return await reads.event(conn, tenant=tenant, event_id=event_id)

    async def tool_events_of_turns(
        self, turn_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[EventRecord]]:
        """Each turn's ``tool.*`` events (what its tool calls are made of), in
        one statement for many turns."""
        async with connect(self.engine) as conn:
            return await reads.tool_events_of_turns(conn, turn_ids=turn_ids)

    async def turn_event_pages(
        self, turn_ids: Sequence[uuid.UUID], *, after: int, limit: int
    ) -> dict[uuid.UUID, list[EventRecord]]:
        """Per turn: up to ``limit`` of its events after seq ``after``, in one statement."""
        async with connect(self.engine) as conn:
            return await reads.turn_event_pages(conn, turn_ids=turn_ids, after=after, limit=limit)

"""New keys admitted together (keyturn.runtime.admitter): submissions to a
session that arrive together share a statement and its commit, and each is
judged as if it had come alone: one turn per key, gapless seqs per session
in the order admitted, the race's losers told who won, a row the database
refuses failing only its own caller, and no session waiting for
another's."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyturn.db import admission
from keyturn.db.admission import NewTurn
from keyturn.db.engine import Engine, connect, create_engine
from keyturn.domain import History
from keyturn.runtime.admission import AdmissionOutcome, admit_turn
from keyturn.runtime.admitter import Admitter
from keyturn.runtime.validation import TurnRequest, fingerprint


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[Engine]:
    e = create_engine(database_url, pool_size=4)
    yield e
    await e.dispose()


async def _sessions(db: Any, n: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    for sid in ids:
        await db.execute("INSERT INTO sessions (id, default_history) VALUES ($1, 'NONE')", sid)
    return ids


async def test_concurrent_new_keys_share_statements_and_keep_every_rule(
    database_url: str, db: Any
) -> None:
    sessions = await _sessions(db, 4)
    # Room for every lookup while each session's first statement waits.
    engine = create_engine(database_url, pool_size=16)
    admitter = Admitter(engine)
    # 60 keys over 4 sessions, and each of the first 20 sent three times at
    # once: the duplicates share statements with their originals.
    requests = [TurnRequest(sessions[i % 4], f"k{i}", f"hello {i}", None) for i in range(60)]
    requests += [r for r in requests[:20] for _ in range(2)]
    try:
        # Each session's first statement is held on the session's row until
        # every other submission has arrived: they all arrive while it is in
        # flight, whatever the machine's timing, and must share what follows.
        async with db.transaction():
            await db.execute("SELECT 1 FROM sessions WHERE id = ANY($1) FOR UPDATE", sessions)
            admitted = asyncio.gather(
                *(admit_turn(engine=engine, request=r, admitter=admitter) for r in requests)
            )
            for _ in range(500):
                if sum(len(p) for p in admitter._pending.values()) == len(requests) - 4:
                    break
                await asyncio.sleep(0.02)
            assert sum(len(p) for p in admitter._pending.values()) == len(requests) - 4
        answers = await admitted
    finally:
        await engine.dispose()

    # Fewer statements than admissions: they were shared (4 held, then each
    # session's waiting keys in one).
    assert admitter.admitted == 60
    assert admitter.statements < 60, admitter.statements
    by_key: dict[tuple[uuid.UUID, str], set[uuid.UUID]] = {}
    for request, answer in zip(requests, answers, strict=True):
        assert answer.outcome in (AdmissionOutcome.ACCEPTED, AdmissionOutcome.REPLAYED)
        assert answer.turn is not None
        assert answer.turn.fingerprint == fingerprint(input=request.input, history=History.NONE)
        by_key.setdefault((request.session_id, request.idempotency_key), set()).add(answer.turn.id)
    # Every key names one turn, and every one of its submissions was told so;
    # exactly one of them was the acceptance.
    assert len(by_key) == 60 and all(len(ids) == 1 for ids in by_key.values())
    assert sum(a.outcome is AdmissionOutcome.ACCEPTED for a in answers) == 60

    for sid in sessions:
        turns = await db.fetch(
            "SELECT id, admit_seq FROM turns WHERE session_id = $1 ORDER BY admit_seq", sid
        )
        events = await db.fetch(
            "SELECT seq, turn_id, type, (data ->> 'seq')::bigint AS data_seq FROM events"
            " WHERE session_id = $1 ORDER BY seq",
            sid,
        )
        counter = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1", sid)
        # Gapless from 1, the counter at the last, each turn.started at its
        # turn's admit_seq.
        assert [t["admit_seq"] for t in turns] == list(range(1, 16))
        assert [e["seq"] for e in events] == list(range(1, 16)) and counter == 15
        assert all(e["type"] == "turn.started" for e in events)
        assert [(e["turn_id"], e["data_seq"]) for e in events] == [
            (t["id"], t["admit_seq"]) for t in turns
        ]


async def test_a_row_the_database_refuses_fails_only_its_own_caller(
    engine: Engine, db: Any
) -> None:
    (sid,) = await _sessions(db, 1)
    admitter = Admitter(engine)

    def new(key: str, text: str) -> NewTurn:
        fp = fingerprint(input=text, history=History.NONE)
        return NewTurn(uuid.uuid4(), "", sid, key, fp, text, History.NONE, {"idempotencyKey": key})

    # The first goes out at once; the three that arrive while it is in
    # flight share a statement, which PostgreSQL refuses whole for the text
    # it cannot hold; each of those is then sent alone.
    rows = [new("a", "first"), new("b", "second"), new("bad", "no\x00nul"), new("c", "third")]
    results = await asyncio.gather(*(admitter.admit(r) for r in rows), return_exceptions=True)

    assert isinstance(results[2], Exception)
    admitted = [r for r in results if not isinstance(r, BaseException)]
    assert [t.idempotency_key for t in admitted if t is not None] == ["a", "b", "c"]
    keys = await db.fetch("SELECT idempotency_key FROM turns ORDER BY admit_seq")
    assert [k["idempotency_key"] for k in keys] == ["a", "b", "c"]
    seqs = await db.fetch("SELECT seq FROM events WHERE session_id = $1 ORDER BY seq", sid)
    assert [s["seq"] for s in seqs] == [1, 2, 3]
    assert admitter.statements == 3  # the first, then two alone; the refused ones count not


async def test_a_row_of_another_tenant_is_not_admitted_with_the_rest(
    engine: Engine, db: Any
) -> None:
    """A row naming the session under another tenant admits nothing, while
    the rest of its statement does."""
    (sid,) = await _sessions(db, 1)
    admitter = Admitter(engine)
    text = "hi"
    fp = fingerprint(input=text, history=History.NONE)
    rows = [
        NewTurn(uuid.uuid4(), "", sid, "first", fp, text, History.NONE, {}),
        NewTurn(uuid.uuid4(), "other-tenant", sid, "theirs", fp, text, History.NONE, {}),
        NewTurn(uuid.uuid4(), "", sid, "ours", fp, text, History.NONE, {}),
    ]
    results = await asyncio.gather(*(admitter.admit(r) for r in rows))
    assert [r is not None for r in results] == [True, False, True]
    # The first at once, the two that came while it was in flight together.
    assert admitter.statements == 2
    keys = await db.fetch("SELECT idempotency_key, admit_seq FROM turns ORDER BY admit_seq")
    assert [(k["idempotency_key"], k["admit_seq"]) for k in keys] == [("first", 1), ("ours", 2)]


async def test_a_session_held_by_another_writer_holds_up_only_its_own_submissions(
    engine: Engine, db: Any
) -> None:
    """Submissions to a session another transaction holds (a turn's end,
    say) wait for it; those to other sessions do not wait with them."""
    held, free = await _sessions(db, 2)
    admitter = Admitter(engine)
    fp = fingerprint(input="hi", history=History.NONE)
    tx = db.transaction()
    await tx.start()
    await db.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", held)
    try:
        waiting = [
            asyncio.ensure_future(
                admitter.admit(NewTurn(uuid.uuid4(), "", held, k, fp, "hi", History.NONE, {}))
            )
            for k in ("h1", "h2", "h3")
        ]
        other = NewTurn(uuid.uuid4(), "", free, "f", fp, "hi", History.NONE, {})
        # Answered while the held session stays held.
        turn = await asyncio.wait_for(admitter.admit(other), 10)
        assert turn is not None and turn.session_id == free
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiting)
    finally:
        await tx.rollback()
    turns = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert [t.admit_seq for t in turns if t is not None] == [1, 2, 3]
    # The free session's; the held one's first, waiting for it; then the
    # two that came meanwhile, together.
    assert admitter.statements == 3


async def _record_of(db: Any, sid: uuid.UUID) -> dict[str, Any]:
    """What the record holds of a session, without what differs by design
    between two sessions (ids, times)."""
    turns = await db.fetch(
        "SELECT idempotency_key, fingerprint, input, history, status, admit_seq, epoch"
        " FROM turns WHERE session_id = $1 ORDER BY admit_seq",
        sid,
    )
    events = await db.fetch(
        "SELECT e.seq, e.type, e.data, t.idempotency_key FROM events e"
        " JOIN turns t ON t.id = e.turn_id WHERE e.session_id = $1 ORDER BY e.seq",
        sid,
    )
    keys = await db.fetch(
        "SELECT k.idempotency_key, k.kind, t.idempotency_key AS turn_key FROM session_keys k"
        " LEFT JOIN turns t ON t.id = k.turn_id WHERE k.session_id = $1"
        " ORDER BY k.idempotency_key",
        sid,
    )
    counter = await db.fetchval("SELECT event_seq FROM sessions WHERE id = $1", sid)
    return {
        "turns": [dict(r) for r in turns],
        "events": [dict(r) for r in events],
        "keys": [dict(r) for r in keys],
        "counter": counter,
    }


async def test_a_lone_key_is_written_as_the_batched_statement_writes_it(
    engine: Engine, db: Any
) -> None:
    """A lone new key goes out as the one-row form of the admission
    statement; a batch of one, as the batched form. The same submissions
    through each, into two sessions alike, answer and write the same."""

    async def one_row(conn: Any, new: NewTurn, reject: bool) -> Any:
        return await admission.admit_many(conn, [new], reject=reject)

    async def batched(conn: Any, new: NewTurn, reject: bool) -> Any:
        return await admission._admit_rows(conn, [new], reject=reject)

    texts = {"a": "hello", "b": 'héllo {"x": [1]} \u2603', "c": "third"}
    answers: dict[str, list[Any]] = {}
    records: dict[str, dict[str, Any]] = {}
    for name, form in (("one row", one_row), ("batched", batched)):
        sid, other = await _sessions(db, 2)
        missing = uuid.uuid4()

        def new(key: str, *, session: uuid.UUID = sid, tenant: str = "") -> NewTurn:
            text = texts.get(key, key)
            fp = fingerprint(input=text, history=History.FULL)
            data = {"idempotencyKey": key, "history": "FULL", "input": text}
            return NewTurn(uuid.uuid4(), tenant, session, key, fp, text, History.FULL, data)

        seen: list[Any] = []
        async with connect(engine) as conn:
            for submission, reject in (
                (new("a"), False),  # a new key
                (new("a"), False),  # the same key again: taken
                (new("b"), False),  # another new key: the next seq
                (new("x", tenant="someone-else"), False),  # the session under another tenant
                (new("y", session=missing), False),  # no such session
                (new("c"), True),  # REJECT while a and b are queued
                (new("z", session=other), True),  # REJECT in an idle session
            ):
                done = await form(conn, submission, reject)
                turn = done.get(submission.turn_id)
                assert set(done) <= {submission.turn_id}
                seen.append(
                    None
                    if turn is None
                    else (
                        turn.idempotency_key,
                        turn.status,
                        turn.admit_seq,
                        turn.input,
                        turn.fingerprint,
                        turn.history,
                        turn.epoch,
                        turn.session_id == submission.session_id,
                    )
                )
        answers[name] = seen
        records[name] = {"busy": await _record_of(db, sid), "idle": await _record_of(db, other)}

    assert answers["one row"] == answers["batched"]
    assert [a is not None for a in answers["one row"]] == [
        True,
        False,
        True,
        False,
        False,
        False,
        True,
    ]
    assert records["one row"] == records["batched"]
    busy = records["one row"]["busy"]
    assert [t["admit_seq"] for t in busy["turns"]] == [1, 2] and busy["counter"] == 2
    assert [e["type"] for e in busy["events"]] == ["turn.started", "turn.started"]

"""The record's lifetime: a key answers replays for the key retention after
its turn ended, then KeyExpired (never a new turn); the sweeper prunes turns
to tombstones that keep answering KeyExpired, forgets tombstones after theirs,
and is safe to cancel, to run beside admissions, and to run twice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from keyturn.db.engine import create_engine
from keyturn.http.metrics import PrometheusStats
from keyturn.runtime.retention import PassReport, RetentionPolicy, Sweeper
from tests import figures
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.backlog import assert_backlog_pruned, seed_backlog

HOUR = 3600
DAY = 24 * HOUR

SUBMIT = """
mutation($input: SubmitTurnInput!) { submitTurn(input: $input) {
  __typename
  ... on TurnAdmission { turn { id status output } }
  ... on UserError { code message }
  ... on KeyExpired { idempotencyKey turnId expiredAt }
} }
"""

POLICY = """{ serverPolicy { keyRetentionSeconds keyRetention turnRetentionSeconds turnRetention
  tombstoneRetentionSeconds tombstoneRetention } }"""


@contextlib.asynccontextmanager
async def retaining(database_url: str, **retention: Any) -> AsyncIterator[GraphQLClient]:
    """A server with these retentions (its own sweeper left idle: the tests
    run passes themselves), and a client of it."""
    settings = fast_settings(retention_sweep_s=3600, **retention)
    async with serve_in_process(database_url, settings) as server:
        client = GraphQLClient(server.url)
        try:
            yield client
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def sweeper(
    database_url: str, policy: RetentionPolicy, batch: int = 200, batch_events: int = 20_000
) -> AsyncIterator[Sweeper]:
    engine = create_engine(database_url, pool_size=2)
    try:
        yield Sweeper(engine=engine, policy=policy, batch=batch, batch_events=batch_events)
    finally:
        await engine.dispose()


async def submit(client: GraphQLClient, sid: str, key: str, input: str) -> dict[str, Any]:
    data = await client.execute(
        SUBMIT, {"input": {"sessionId": sid, "idempotencyKey": key, "input": input}}
    )
    result: dict[str, Any] = data["submitTurn"]
    return result


async def ended_ago(db: Any, turn_id: str, seconds: float) -> None:
    """Move the turn's end back in time, as if ``seconds`` had passed."""
    await db.execute(
        "UPDATE turns SET completed_at = now() - make_interval(secs => $2) WHERE id = $1::uuid",
        turn_id,
        float(seconds),
    )


async def everything(db: Any) -> tuple[int, int, int]:
    """(turns, events, tombstones) in the whole database."""
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM turns) AS t, (SELECT count(*) FROM events) AS e, "
        "(SELECT count(*) FROM key_tombstones) AS k"
    )
    return row["t"], row["e"], row["k"]


async def completed_turn(client: GraphQLClient, sid: str, key: str, input: str) -> str:
    first = await submit(client, sid, key, input)
    assert first["__typename"] == "TurnAccepted"
    tid: str = first["turn"]["id"]
    await client.wait_for_status(tid, {"COMPLETED"})
    return tid


async def test_a_key_replays_until_its_retention_passes_then_answers_key_expired(
    database_url: str, db: Any
) -> None:
    async with retaining(database_url, key_retention="1h") as client:
        sid = await client.create_session()
        tid = await completed_turn(client, sid, "k1", "hello")

        await ended_ago(db, tid, HOUR - 60)  # a minute before expiry
        before = await everything(db)
        again = await submit(client, sid, "k1", "hello")
        assert again["__typename"] == "TurnReplayed"
        assert again["turn"]["id"] == tid and again["turn"]["status"] == "COMPLETED"
        assert again["turn"]["output"].startswith("fixture reply to: hello")

        await ended_ago(db, tid, HOUR + 1)  # a second after
        expired = await submit(client, sid, "k1", "hello")
        assert expired["__typename"] == "KeyExpired"
        assert expired["code"] == "KEY_EXPIRED"
        assert expired["turnId"] == tid and expired["idempotencyKey"] == "k1"
        ended = await db.fetchval("SELECT completed_at FROM turns WHERE id = $1::uuid", tid)
        assert expired["expiredAt"] == (ended + timedelta(hours=1)).isoformat()
        assert "use a new key" in expired["message"].lower()
        # The key is spent whatever is asked: another request is KeyExpired too.
        other = await submit(client, sid, "k1", "something else")
        assert other["__typename"] == "KeyExpired" and other["turnId"] == tid
        assert await everything(db) == before

        # A new key is a new turn, as always.
        fresh = await submit(client, sid, "k2", "hello")
        assert fresh["__typename"] == "TurnAccepted"


async def test_a_turn_that_has_not_ended_answers_replays_however_old(
    database_url: str, db: Any
) -> None:
    async with retaining(database_url, key_retention="90s") as client:
        sid = await client.create_session()
        first = await submit(client, sid, "slow", "/sleep 4000 still going")
        tid = first["turn"]["id"]
        await db.execute(
            "UPDATE turns SET created_at = now() - interval '30 days' WHERE id = $1::uuid", tid
        )
        again = await submit(client, sid, "slow", "/sleep 4000 still going")
        assert again["__typename"] == "TurnReplayed" and again["turn"]["id"] == tid
        assert again["turn"]["status"] in {"QUEUED", "RUNNING"}


async def test_the_default_keeps_keys_forever(database_url: str, db: Any) -> None:
    async with retaining(database_url) as client:
        sid = await client.create_session()
        tid = await completed_turn(client, sid, "k", "hello")
        await ended_ago(db, tid, 3650 * DAY)
        again = await submit(client, sid, "k", "hello")
        assert again["__typename"] == "TurnReplayed" and again["turn"]["id"] == tid
        assert (await client.execute(POLICY))["serverPolicy"] == {
            "keyRetentionSeconds": None,
            "keyRetention": "forever",
            "turnRetentionSeconds": None,
            "turnRetention": "forever",
            "tombstoneRetentionSeconds": None,
            "tombstoneRetention": "forever",
        }


async def test_server_policy_publishes_the_retentions(database_url: str) -> None:
    async with retaining(
        database_url, key_retention="24h", turn_retention="30d", tombstone_retention="90s"
    ) as client:
        assert (await client.execute(POLICY))["serverPolicy"] == {
            "keyRetentionSeconds": DAY,
            "keyRetention": "1d",  # the largest unit that divides it
            "turnRetentionSeconds": 30 * DAY,
            "turnRetention": "30d",
            "tombstoneRetentionSeconds": 90,
            "tombstoneRetention": "90s",
        }


async def test_a_pruned_turn_leaves_a_tombstone_that_answers_key_expired_until_it_is_forgotten(
    database_url: str, db: Any
) -> None:
    policy = RetentionPolicy(key_s=HOUR, turn_s=2 * HOUR, tombstone_s=DAY)
    async with (
        retaining(
            database_url, key_retention="1h", turn_retention="2h", tombstone_retention="1d"
        ) as client,
        sweeper(database_url, policy) as sweep,
    ):
        sid = await client.create_session()
        old = await completed_turn(client, sid, "old", "hello")
        kept = await completed_turn(client, sid, "kept", "later")
        seqs_before = [
            r["seq"]
            for r in await db.fetch(
                "SELECT seq FROM events WHERE session_id = $1::uuid ORDER BY seq", sid
            )
        ]
        old_types = [
            r["type"]
            for r in await db.fetch(
                "SELECT type FROM events WHERE turn_id = $1::uuid ORDER BY seq", old
            )
        ]
        await ended_ago(db, old, 2 * HOUR + 5)
        ended = await db.fetchval("SELECT completed_at FROM turns WHERE id = $1::uuid", old)
        fingerprint = await db.fetchval("SELECT fingerprint FROM turns WHERE id = $1::uuid", old)
        assert fingerprint

        report = await sweep.run_pass()
        assert (report.turns, report.events, report.tombstones_made) == (1, len(old_types), 1)
        assert await db.fetchval("SELECT count(*) FROM turns WHERE id = $1::uuid", old) == 0
        stone = await db.fetchrow("SELECT * FROM key_tombstones WHERE session_id = $1::uuid", sid)
        assert str(stone["turn_id"]) == old and stone["idempotency_key"] == "old"
        assert stone["ended_at"] == ended and stone["expired_at"] == ended + timedelta(hours=1)
        # The tombstone keeps the fingerprint of the request that made the turn.
        assert stone["fingerprint"] == fingerprint

        # The session's record keeps every seq: the pruned turn's events say
        # what they were and that their data is gone.
        rows = await db.fetch(
            "SELECT seq, type, turn_id, data FROM events WHERE session_id = $1::uuid ORDER BY seq",
            sid,
        )
        assert [r["seq"] for r in rows] == seqs_before == list(range(1, len(rows) + 1))
        pruned = [r for r in rows if r["turn_id"] is None]
        assert [r["type"] for r in pruned] == old_types
        assert old_types[0] == "turn.started" and old_types[-1] == "turn.completed"
        assert all(r["data"] == '{"pruned": true}' for r in pruned)
        session = await client.session(sid)
        assert session["eventCount"] == len(rows)
        assert [t["node"]["id"] for t in session["turns"]["edges"]] == [kept]

        before = await everything(db)
        retry = await submit(client, sid, "old", "hello")
        assert retry["__typename"] == "KeyExpired" and retry["turnId"] == old
        assert retry["expiredAt"] == (ended + timedelta(hours=1)).isoformat()
        # Another request under the spent key: KeyExpired too, not a conflict
        # (admission answers an expired key without comparing fingerprints).
        changed = await submit(client, sid, "old", "other")
        assert changed == retry, changed
        assert await everything(db) == before
        # The kept turn (ended just now) still replays.
        assert (await submit(client, sid, "kept", "later"))["__typename"] == "TurnReplayed"

        # A second pass finds nothing more.
        again = await sweep.run_pass()
        assert (again.turns, again.tombstones_forgotten) == (0, 0)

        # After the tombstone retention the key is forgotten: the documented
        # consequence is that the same key names a new turn.
        await db.execute(
            "UPDATE key_tombstones SET pruned_at = now() - interval '1 day 1 second' "
            "WHERE session_id = $1::uuid",
            sid,
        )
        forgot = await sweep.run_pass()
        assert forgot.tombstones_forgotten == 1
        reborn = await submit(client, sid, "old", "hello")
        assert reborn["__typename"] == "TurnAccepted" and reborn["turn"]["id"] != old


async def test_turns_named_by_a_resolution_are_kept_whole(database_url: str, db: Any) -> None:
    policy = RetentionPolicy(key_s=HOUR, turn_s=HOUR)
    async with (
        retaining(database_url, key_retention="1h", turn_retention="1h") as client,
        sweeper(database_url, policy) as sweep,
    ):
        sid = await client.create_session()
        tid = await completed_turn(client, sid, "k", "hello")
        # As an interrupted turn that was abandoned leaves it.
        await db.execute("UPDATE turns SET status = 'INTERRUPTED' WHERE id = $1::uuid", tid)
        await db.execute(
            "INSERT INTO resolutions (id, session_id, turn_id, idempotency_key, fingerprint, "
            "action, force) VALUES (gen_random_uuid(), $1::uuid, $2::uuid, 'r', 'f', "
            "'ABANDON', false)",
            sid,
            tid,
        )
        await ended_ago(db, tid, 2 * HOUR)
        assert (await sweep.run_pass()).turns == 0
        assert await db.fetchval("SELECT count(*) FROM turns WHERE id = $1::uuid", tid) == 1
        # Its key has expired all the same.
        assert (await submit(client, sid, "k", "hello"))["__typename"] == "KeyExpired"


async def test_concurrent_retries_racing_the_sweeper_never_make_a_second_turn(
    database_url: str, db: Any
) -> None:
    policy = RetentionPolicy(key_s=60, turn_s=60)
    settings = fast_settings(
        key_retention="60s", turn_retention="60s", retention_sweep_s=3600, pool_size=20
    )
    async with (
        serve_in_process(database_url, settings) as server,
        sweeper(database_url, policy, batch=1) as sweep,
    ):
        client = GraphQLClient(server.url)
        try:
            sid = await client.create_session()
            tid = await completed_turn(client, sid, "racing", "hello")
        finally:
            await client.close()
        await ended_ago(db, tid, 30)  # half of its key retention left
        race = await _race(server, db, sid, tid, retries=1000, sweep=sweep)

    answers = race.answers
    assert len(answers) == 1000
    assert {a.kind for a in answers} == {"TurnReplayed", "KeyExpired"}, {a.kind for a in answers}
    # Every answer names the one turn.
    assert {a.turn_id for a in answers} == {tid}
    # Before the turn's end moved past the retention the key replays; a retry
    # sent after that is KeyExpired, whether the turn or its tombstone answers.
    # Admission judges expiry itself: some retries were answered by the turn
    # before the sweeper pruned it.
    assert all(a.kind == "TurnReplayed" for a in answers if a.answered < _AGING)
    assert all(a.kind == "KeyExpired" for a in answers if a.sent >= _AGED)
    assert any(a.sent == _AGED and a.answered == _AGED for a in answers)
    # The sweeper pruned the turn once, in the middle of the retries: some were
    # in flight across the prune, and some were sent only after it.
    assert sum(r.tombstones_made for r in race.passes) == 1
    assert sum(r.turns for r in race.passes) == 1
    assert any(a.sent < _PRUNED <= a.answered for a in answers)
    assert any(a.sent >= _PRUNED for a in answers)
    assert race.peak_in_flight > 100
    # Afterwards: the key is in exactly one place, naming the original turn.
    turns = await db.fetch(
        "SELECT id FROM turns WHERE session_id = $1::uuid AND idempotency_key = 'racing'", sid
    )
    stones = await db.fetch("SELECT turn_id FROM key_tombstones WHERE session_id = $1::uuid", sid)
    assert [str(r["id"]) for r in turns] + [str(r["turn_id"]) for r in stones] == [tid]
    assert await db.fetchval("SELECT count(*) FROM turns WHERE session_id = $1::uuid", sid) == 0


# The race's milestones, in order: the turn's end is being moved past the key
# (and turn) retention, it has been, the sweeper has pruned the turn to a
# tombstone.
_FRESH, _AGING, _AGED, _PRUNED = range(4)


@dataclass(frozen=True, slots=True)
class _Answer:
    kind: str
    turn_id: str
    sent: int  # the milestone reached when the request was sent
    answered: int  # and when its answer arrived


@dataclass
class _Race:
    answers: list[_Answer]
    passes: list[PassReport]
    peak_in_flight: int


# httpx's pool scans every queued request against every connection whenever a
# request starts or ends: a thousand requests queued on one client spend about
# a minute of the event loop (which the server shares) in that scan alone. So
# the retries are spread over clients with as many connections as requests
# each, and none queue. 250 in flight: well over the server's 20 database
# connections, so admissions queue for the pool as they do under load (an
# open server, with no tokens, has no per-tenant limit on requests).
_CLIENTS = 10
_PER_CLIENT = 25


async def _race(
    server: InProcessServer, db: Any, sid: str, tid: str, *, retries: int, sweep: Sweeper
) -> _Race:
    """``retries`` same-key submissions over HTTP, 250 at a time, while the
    sweeper runs pass after pass. A fifth of the way in, the turn's end is
    moved past the key (and turn) retention between two passes; once a retry
    sent after that is answered, the passes go on and prune the turn while
    retries are in flight. The last quarter is sent only after the prune. So
    retries meet the key replaying, expired with its turn, and a tombstone."""
    milestone = _FRESH
    aged_answer = asyncio.Event()  # a retry sent after the aging has its answer
    pruned = asyncio.Event()
    fifth = asyncio.Event()  # a fifth of the answers are in
    between_passes = asyncio.Lock()
    answers: list[_Answer] = []
    passes: list[PassReport] = []
    in_flight = peak = 0
    started = 0
    done = asyncio.Event()

    def batch_done(report: PassReport) -> None:
        nonlocal milestone
        if report.tombstones_made and not pruned.is_set():
            milestone = _PRUNED  # the batch has committed
            pruned.set()

    async def sweeping() -> None:
        while not done.is_set():
            async with between_passes:
                passes.append(await sweep.run_pass(on_batch=batch_done))
            await asyncio.sleep(0.01)

    async def age() -> None:
        nonlocal milestone
        await fifth.wait()
        async with between_passes:
            milestone = _AGING
            await ended_ago(db, tid, 61)
            milestone = _AGED
            await asyncio.wait_for(aged_answer.wait(), 30)

    body = {
        "query": SUBMIT,
        "variables": {"input": {"sessionId": sid, "idempotencyKey": "racing", "input": "hello"}},
    }

    def retryable(response: httpx.Response) -> bool:
        # UNAVAILABLE comes as a 503 when the whole request failed on it.
        if response.status_code not in (200, 503):
            return False
        errors = response.json().get("errors") or []
        return any(e.get("extensions", {}).get("retryable") for e in errors)

    async def send(http: httpx.AsyncClient) -> httpx.Response:
        # A connection lost on a loaded machine, or a retryable UNAVAILABLE
        # (the pool busy past its timeout), is what a client meets too: it
        # sends the same request again, under the same key. The milestone
        # only grows, so the answer's expectations stand for the first send.
        for _ in range(5):
            try:
                response = await http.post("/graphql", json=body)
            except httpx.TransportError:
                await asyncio.sleep(0.1)
                continue
            if not retryable(response):
                return response
            figures.add("submissions retried after a retryable error")
            await asyncio.sleep(0.1)
        return await http.post("/graphql", json=body)

    async def retrying(http: httpx.AsyncClient) -> None:
        nonlocal started, in_flight, peak
        while started < retries:
            if started >= retries - retries // 4 and not pruned.is_set():
                await asyncio.wait_for(pruned.wait(), 30)
                continue
            started += 1
            sent = milestone
            in_flight += 1
            peak = max(peak, in_flight)
            response = await send(http)
            in_flight -= 1
            assert response.status_code == 200, response.text
            data = response.json()
            assert not data.get("errors"), data
            answer = data["data"]["submitTurn"]
            kind = answer["__typename"]
            turn_id = answer["turn"]["id"] if kind == "TurnReplayed" else answer.get("turnId")
            answers.append(_Answer(kind, str(turn_id), sent, milestone))
            if len(answers) == retries // 5:
                fifth.set()
            if sent == _AGED:
                aged_answer.set()

    limits = httpx.Limits(max_connections=_PER_CLIENT, max_keepalive_connections=_PER_CLIENT)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits)
            )
            for _ in range(_CLIENTS)
        ]
        sweeper_task = asyncio.create_task(sweeping())
        try:
            await asyncio.gather(
                age(), *(retrying(http) for http in clients for _ in range(_PER_CLIENT))
            )
        finally:
            done.set()
            await sweeper_task
    return _Race(answers, passes, peak)


async def test_a_sweep_cancelled_between_batches_resumes_to_the_same_record(
    database_url: str, db: Any
) -> None:
    await seed_backlog(db, sessions=6, turns_per_session=20, ended_ago=timedelta(days=3))
    events_before = await db.fetchval("SELECT count(*) FROM events")
    policy = RetentionPolicy(key_s=HOUR, turn_s=DAY, tombstone_s=None)
    async with sweeper(database_url, policy, batch=7) as sweep:
        stop_after = asyncio.Event()

        def count(report: PassReport) -> None:
            if report.batches == 3:
                stop_after.set()

        task = asyncio.create_task(sweep.run_pass(on_batch=count))
        await stop_after.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        partway = await everything(db)
        assert 0 < partway[2] < 120  # some pruned, some not
        assert partway[0] + partway[2] == 120  # every key in exactly one place
        # Each turn's events were blanked with it, or not at all.
        assert (
            await db.fetchval(
                "SELECT count(*) FROM events WHERE turn_id IS NULL AND data <> '{\"pruned\": true}'"
            )
            == 0
        )
        assert (
            await db.fetchval("SELECT count(*) FROM events WHERE turn_id IS NULL") == 3 * partway[2]
        )

        resumed = await sweep.run_pass()
        assert resumed.turns == 120 - partway[2]
    await assert_backlog_pruned(db, turns=120, events=events_before)


async def test_a_batch_blanks_no_more_events_than_its_bound_and_a_longer_turn_goes_alone(
    database_url: str, db: Any
) -> None:
    # Each piece of a stream its own turn.delta event: flushed every 1 ms.
    async with retaining(
        database_url, key_retention="1h", turn_retention="1d", delta_flush_ms=1
    ) as client:
        sid = await client.create_session()
        # Streamed turns of about thirty events, one of a hundred and more
        # (above the bound) among them, and short ones.
        inputs = [f"/stream 25 5 long {i}" for i in range(5)]
        inputs[2:2] = ["/stream 90 5 longest", "short", "/write n=v short too"]
        for i, text in enumerate(inputs):
            await completed_turn(client, sid, f"k{i}", text)
    rows = await db.fetch(
        "SELECT t.id, (SELECT count(*) FROM events e WHERE e.turn_id = t.id) AS n "
        "FROM turns t ORDER BY t.completed_at"
    )
    sizes = [r["n"] for r in rows]
    # The bound is the second-largest turn's events: the largest is above
    # it and goes alone. A loaded machine writes some pieces of a stream
    # together, so the sizes are what the record holds, not the inputs'.
    *_, second, largest = sorted(sizes)
    bound = second if second < largest else largest - 1
    assert max(sizes) > bound and sum(sizes) > 3 * bound, sizes
    # Oldest first, as many as fit the bound; a turn above it alone.
    expected: list[tuple[int, int]] = []
    for n in sizes:
        if expected and expected[-1][1] + n <= bound:
            expected[-1] = (expected[-1][0] + 1, expected[-1][1] + n)
        else:
            expected.append((1, n))

    seen: list[tuple[int, int]] = []

    def batch_done(report: PassReport) -> None:
        turns = report.turns - sum(t for t, _ in seen)
        events = report.events - sum(e for _, e in seen)
        seen.append((turns, events))

    policy = RetentionPolicy(key_s=HOUR, turn_s=DAY)
    async with sweeper(database_url, policy, batch_events=bound) as sweep:
        await db.execute("UPDATE turns SET completed_at = completed_at - interval '2 days'")
        report = await sweep.run_pass(on_batch=batch_done)
    removing = [b for b in seen if b[0]]
    assert removing == expected, (sizes, seen)
    assert all(events <= bound or turns == 1 for turns, events in removing)
    assert (report.turns, report.events) == (len(sizes), sum(sizes))
    assert report.batches == len(expected) + 1  # and the one that found nothing left
    assert await everything(db) == (0, sum(sizes), len(sizes))


def _pruned_metric(what: str) -> float:
    """keyturn_retention_pruned_total{what} as /metrics would show it now."""
    return REGISTRY.get_sample_value("keyturn_retention_pruned_total", {"what": what}) or 0.0


def _passes_metric() -> float:
    return REGISTRY.get_sample_value("keyturn_retention_passes_total") or 0.0


async def test_a_pass_over_a_backlog_logs_and_counts_its_progress_batch_by_batch(
    database_url: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await seed_backlog(db, sessions=4, turns_per_session=10, ended_ago=timedelta(days=3))
    events_before = await db.fetchval("SELECT count(*) FROM events")
    policy = RetentionPolicy(key_s=HOUR, turn_s=DAY, tombstone_s=DAY)
    # The metrics the sweeper feeds are the ones `keyturn serve` publishes
    # (the registry is this process's, so only what this pass adds is read).
    base = {what: _pruned_metric(what) for what in ("turns", "events", "tombstones")}
    passes_base = _passes_metric()
    # Mid-pass scrapes, one after each batch: (the pass so far, the counters then).
    scraped: list[tuple[int, int, float, float, float]] = []

    def scrape(report: PassReport) -> None:
        scraped.append(
            (
                report.turns,
                report.events,
                _pruned_metric("turns") - base["turns"],
                _pruned_metric("events") - base["events"],
                _passes_metric() - passes_base,
            )
        )

    engine = create_engine(database_url, pool_size=2)
    try:
        # A progress line after every batch (in service, at most one per 5 s).
        sweep = Sweeper(
            engine=engine, policy=policy, batch=9, stats=PrometheusStats(), progress_every_s=0
        )
        with caplog.at_level(logging.INFO, logger="keyturn.runtime.retention"):
            report = await sweep.run_pass(on_batch=scrape)
    finally:
        await engine.dispose()

    assert (report.turns, report.tombstones_made, report.events) == (40, 40, events_before)
    # 40 turns in batches of 9: five that prune, one that finds no turn left,
    # and one that finds no tombstone old enough to forget.
    assert report.batches == 7
    # Each scrape during the pass saw the counters at what the pass had done
    # so far: they moved batch by batch, not at the end.
    assert [(t, e) for t, e, _, _, _ in scraped] == [(t, e) for _, _, t, e, _ in scraped]
    assert [t for t, _, _, _, _ in scraped] == [9, 18, 27, 36, 40, 40, 40]
    assert {p for _, _, _, _, p in scraped} == {0}  # the pass itself counts at its end
    assert _pruned_metric("turns") - base["turns"] == 40
    assert _pruned_metric("events") - base["events"] == events_before
    assert _pruned_metric("tombstones") - base["tombstones"] == 0
    assert _passes_metric() - passes_base == 1

    records = [r for r in caplog.records if r.name == "keyturn.runtime.retention"]
    progress = [r for r in records if not r.__dict__["pass_done"]]
    final = [r for r in records if r.__dict__["pass_done"]]
    assert [r.__dict__["batches"] for r in progress] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.__dict__["pruned_turns"] for r in progress] == [9, 18, 27, 36, 40, 40, 40]
    assert all(r.levelno == logging.INFO for r in records)
    assert progress[0].getMessage().startswith("retention pass in progress: pruned 9 turns")
    assert len(final) == 1 and records[-1] is final[0]
    line = final[0]
    assert line.getMessage() == report.line()
    assert line.getMessage().startswith(
        f"retention pass: pruned 40 turns ({events_before} events blanked, "
        "40 tombstones made), forgot 0 tombstones, 7 batches in "
    )
    fields = {
        k: line.__dict__[k]
        for k in (
            "pruned_turns",
            "tombstones_made",
            "blanked_events",
            "forgotten_tombstones",
            "batches",
            "busy_batches",
            "left_busy",
        )
    }
    assert fields == {
        "pruned_turns": 40,
        "tombstones_made": 40,
        "blanked_events": events_before,
        "forgotten_tombstones": 0,
        "batches": 7,
        "busy_batches": 0,
        "left_busy": False,
    }
    assert line.__dict__["elapsed_s"] == round(report.seconds, 3)
    await assert_backlog_pruned(db, turns=40, events=events_before)

    # A day later the tombstones are forgotten, and counted as they go too.
    await db.execute("UPDATE key_tombstones SET pruned_at = now() - interval '1 day 1 second'")
    caplog.clear()
    engine = create_engine(database_url, pool_size=2)
    try:
        sweep = Sweeper(engine=engine, policy=policy, batch=25, stats=PrometheusStats())
        forgotten: list[tuple[int, float]] = []
        with caplog.at_level(logging.INFO, logger="keyturn.runtime.retention"):
            forgot = await sweep.run_pass(
                on_batch=lambda r: forgotten.append(
                    (r.tombstones_forgotten, _pruned_metric("tombstones") - base["tombstones"])
                )
            )
    finally:
        await engine.dispose()
    assert forgot.tombstones_forgotten == 40
    # One batch of turns (none left), then 25 + 15 tombstones and an empty batch.
    assert forgotten == [(0, 0), (25, 25), (40, 40), (40, 40)]
    last = [r for r in caplog.records if r.name == "keyturn.runtime.retention"][-1]
    assert last.__dict__["pass_done"] and last.__dict__["forgotten_tombstones"] == 40
    assert await db.fetchval("SELECT count(*) FROM key_tombstones") == 0


async def test_two_sweepers_on_one_database_share_a_backlog_without_a_double_prune(
    database_url: str, db: Any
) -> None:
    """As every process runs a sweeper: two passes at once over one backlog,
    each on its own engine, in small batches that meet each other's locks."""
    await seed_backlog(db, sessions=8, turns_per_session=15, ended_ago=timedelta(days=3))
    events_before = await db.fetchval("SELECT count(*) FROM events")
    policy = RetentionPolicy(key_s=HOUR, turn_s=DAY, tombstone_s=None)
    async with (
        sweeper(database_url, policy, batch=5) as one,
        sweeper(database_url, policy, batch=5) as other,
    ):
        first, second = await asyncio.wait_for(
            asyncio.gather(one.run_pass(), other.run_pass()), timeout=120
        )

    # Between them they pruned the backlog exactly once.
    assert first.turns + second.turns == 120
    assert first.tombstones_made + second.tombstones_made == 120
    assert first.events + second.events == events_before
    assert not first.left_busy and not second.left_busy
    # Every key is in exactly one place: a tombstone of its own turn, made once.
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    stones = await db.fetch("SELECT session_id, idempotency_key, turn_id FROM key_tombstones")
    assert len(stones) == 120
    assert len({(r["session_id"], r["idempotency_key"]) for r in stones}) == 120
    assert len({r["turn_id"] for r in stones}) == 120
    await assert_backlog_pruned(db, turns=120, events=events_before)

"""The retention sweeper as an operator runs it: ``keyturn serve`` prunes on
its own timer, and a serve SIGKILLed inside a batch loses that batch whole
and finishes after a restart, every key answering KeyExpired, never a new
turn; ``keyturn prune --dry-run`` says what a pass would remove and removes
nothing; a pass SIGKILLed inside a batch and run again ends with the record
one clean pass leaves; a pass logs its progress, at KEYTURN_LOG_LEVEL; a
server's /metrics counts what its own sweeper pruned; doctor publishes the
policy; a retention that is not one stops the command with one line."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from tests.acceptance.clirun import clean_env, on_a_terminal, one_clean_line
from tests.integration.test_retention import submit
from tests.support import GraphQLClient, ServerProcess, start_server_process, stop_process
from tests.support.backlog import assert_backlog_pruned, seed_backlog

pytestmark = pytest.mark.slow

RETENTION = {
    "KEYTURN_KEY_RETENTION": "1h",
    "KEYTURN_TURN_RETENTION": "1d",
    "KEYTURN_TOMBSTONE_RETENTION": "30d",
}


def keyturn(*args: str, cwd: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        env=clean_env(**settings),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


FINGERPRINT = """
SELECT md5(coalesce((SELECT string_agg(t::text, ',' ORDER BY id) FROM turns t), '')
        || coalesce((SELECT string_agg(e::text, ',' ORDER BY id) FROM events e), '')
        || coalesce((SELECT string_agg(k::text, ',' ORDER BY session_id, idempotency_key)
                     FROM key_tombstones k), ''))
"""


async def test_dry_run_reports_the_counts_and_writes_nothing(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    await seed_backlog(db, sessions=3, turns_per_session=10, ended_ago=timedelta(days=3))
    # Two turns ended recently: kept. Two tombstones made long ago: forgettable.
    await seed_backlog(db, sessions=1, turns_per_session=2, ended_ago=timedelta(hours=2))
    await db.execute(
        "INSERT INTO key_tombstones (session_id, idempotency_key, fingerprint, turn_id, "
        "ended_at, expired_at, pruned_at) SELECT id, k, 'fp', gen_random_uuid(), "
        "now() - interval '40 days', now() - interval '40 days', now() - interval '31 days' "
        "FROM (SELECT id FROM sessions LIMIT 1) s, unnest(ARRAY['gone-1', 'gone-2']) k"
    )
    before = await db.fetchval(FINGERPRINT)

    result = await asyncio.to_thread(
        keyturn,
        "prune",
        "--dry-run",
        cwd=tmp_path,
        settings={"KEYTURN_DATABASE_URL": database_url, **RETENTION},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "nothing was removed" in out
    assert "turns to prune: 30 (ended " in out and "their events to blank: 90" in out
    assert "tombstones to forget: 2 (made " in out
    assert "after that, the same key names a new turn" in out  # the policy, as doctor says it
    assert await db.fetchval(FINGERPRINT) == before

    # The pass itself removes what the dry run said.
    done = await asyncio.to_thread(
        keyturn, "prune", cwd=tmp_path, settings={"KEYTURN_DATABASE_URL": database_url, **RETENTION}
    )
    assert done.returncode == 0, done.stderr
    assert "pruned 30 turns (90 events blanked, 30 tombstones made), forgot 2 tombstones" in (
        done.stdout
    )
    assert await db.fetchval("SELECT count(*) FROM turns") == 2


async def test_a_pass_killed_inside_a_batch_and_run_again_leaves_the_record_of_one_clean_pass(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    sessions, per = 40, 50
    total = sessions * per
    await seed_backlog(db, sessions=sessions, turns_per_session=per, ended_ago=timedelta(days=3))
    events = await db.fetchval("SELECT count(*) FROM events")
    # Killed inside its fourth batch, once the batch's statement has removed
    # its ten turns and before it commits.
    killed = await asyncio.to_thread(
        keyturn,
        "prune",
        cwd=tmp_path,
        settings={
            "KEYTURN_DATABASE_URL": database_url,
            "KEYTURN_RETENTION_BATCH": "10",
            "KEYTURN_CRASH_AT": "prune_batch:3",
            **RETENTION,
        },
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "crash hook: SIGKILL at prune_batch (call 3)" in killed.stderr

    # The batch the kill interrupted rolled back whole: three batches are
    # pruned, every key is in exactly one place, and a turn's events were
    # blanked with it or not at all.
    left = await db.fetchval("SELECT count(*) FROM turns")
    stones = await db.fetchval("SELECT count(*) FROM key_tombstones")
    assert (left, stones) == (total - 30, 30)
    blanked = await db.fetchval("SELECT count(*) FROM events WHERE turn_id IS NULL")
    assert blanked == 3 * stones

    again = await asyncio.to_thread(
        keyturn, "prune", cwd=tmp_path, settings={"KEYTURN_DATABASE_URL": database_url, **RETENTION}
    )
    assert again.returncode == 0, again.stderr
    assert f"pruned {left} turns ({3 * left} events blanked" in again.stdout
    await assert_backlog_pruned(db, turns=total, events=events)


async def test_a_pass_logs_its_progress_lines_with_their_figures_and_no_secret(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    await seed_backlog(db, sessions=20, turns_per_session=10, ended_ago=timedelta(days=3))
    # A password in the URL (the local server trusts, so any is accepted):
    # it must appear in no line.
    secret = "s3cret-Pa55word"
    url = make_url(database_url).set(password=secret).render_as_string(hide_password=False)
    assert secret in url
    result = await asyncio.to_thread(
        keyturn,
        "prune",
        "--progress-every",
        "0.05",
        cwd=tmp_path,
        settings={"KEYTURN_DATABASE_URL": url, "KEYTURN_RETENTION_BATCH": "5", **RETENTION},
    )
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    # Not on a terminal, the log is JSON lines on stderr, as serve's.
    lines = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    passes = [x for x in lines if x.get("logger") == "keyturn.runtime.retention"]
    progress = [x for x in passes if x["pass_done"] is False]
    assert len(progress) >= 2, result.stderr
    assert all(x["level"] == "INFO" for x in passes)
    assert all(x["message"].startswith("retention pass in progress: pruned ") for x in progress)
    counts = [x["pruned_turns"] for x in progress]
    assert counts == sorted(counts) and 0 < counts[0] < counts[-1] <= 200
    assert all(x["blanked_events"] == 3 * x["pruned_turns"] for x in progress)
    assert all(x["batches"] >= x["pruned_turns"] / 5 for x in progress)
    done = [x for x in passes if x["pass_done"] is True]
    assert len(done) == 1 and done[0]["pruned_turns"] == 200 and done[0]["batches"] >= 40
    # The answer on stdout is the pass's line.
    assert "retention pass: pruned 200 turns (600 events blanked" in result.stdout


@pytest.mark.parametrize("terminal", [False, True])
async def test_at_log_level_warning_a_pass_logs_no_progress_and_still_answers(
    database_url: str, db: Any, tmp_path: Path, terminal: bool
) -> None:
    """KEYTURN_LOG_LEVEL is prune's level as it is serve's: at warning no
    INFO line (neither progress nor the pass's own), and the answer is still
    printed, on a terminal too, where no log line shows it any more."""
    await seed_backlog(db, sessions=4, turns_per_session=10, ended_ago=timedelta(days=3))
    settings = {
        "KEYTURN_DATABASE_URL": database_url,
        "KEYTURN_RETENTION_BATCH": "5",
        "KEYTURN_LOG_LEVEL": "warning",
        **RETENTION,
    }
    args = ["prune", "--progress-every", "0.05"]
    if terminal:
        code, screen = await asyncio.to_thread(on_a_terminal, args, clean_env(**settings), tmp_path)
        assert code == 0, screen
        assert "INFO" not in screen and "in progress" not in screen, screen
        assert screen.count("retention pass: pruned 40 turns (120 events blanked") == 1, screen
        return
    result = await asyncio.to_thread(keyturn, *args, cwd=tmp_path, settings=settings)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert "retention pass: pruned 40 turns (120 events blanked" in result.stdout
    assert await db.fetchval("SELECT count(*) FROM key_tombstones") == 40


@pytest.mark.parametrize("command", ["prune", "serve"])
def test_a_log_level_that_is_not_one_stops_the_command_with_one_line(
    tmp_path: Path, command: str
) -> None:
    result = keyturn(
        command,
        cwd=tmp_path,
        settings={
            "KEYTURN_DATA_DIR": str(tmp_path / "none"),
            "KEYTURN_LOG_LEVEL": "loud",
            **RETENTION,
        },
    )
    line = one_clean_line(result, code=1)
    assert "log_level" in line and "'loud' is not a level" in line, line
    assert not (tmp_path / "none").exists()


async def test_on_a_terminal_the_pass_line_is_shown_once(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    """Its log (stderr) and its answer (stdout) on one terminal: the log's
    last line is the answer, not shown a second time."""
    await seed_backlog(db, sessions=2, turns_per_session=3, ended_ago=timedelta(days=3))
    code, text = await asyncio.to_thread(
        on_a_terminal,
        ["prune"],
        clean_env(KEYTURN_DATABASE_URL=database_url, **RETENTION),
        tmp_path,
    )
    assert code == 0, text
    assert text.count("retention pass: pruned 6 turns") == 1, text


# A pass every 0.3 s, in batches of ten turns.
SWEEPING = {**RETENTION, "KEYTURN_RETENTION_SWEEP_S": "0.3", "KEYTURN_RETENTION_BATCH": "10"}
KILLED_IN = 2  # the batch the kill lands in: batches 0 and 1 commit before it


async def _wait_for(db: Any, sql: str, value: int, server: ServerProcess) -> None:
    for _ in range(600):
        if await db.fetchval(sql) == value:
            return
        assert server.proc.poll() is None, server.log()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{sql} never became {value}: {await db.fetchval(sql)}")


async def test_serve_prunes_on_its_own_timer_and_a_kill_inside_a_batch_loses_only_that_batch(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    server = start_server_process(
        database_url,
        tmp_path,
        env={**SWEEPING, "KEYTURN_CRASH_AT": f"prune_batch:{KILLED_IN}"},
        name="killed",
    )
    client = GraphQLClient(server.url)
    try:
        # Forty real turns in eight sessions, streamed replies and tool calls
        # (their ledger rows are events of the turn), with their real keys.
        inputs: dict[str, tuple[str, str]] = {}  # key -> (session, input)

        async def session_of_turns(s: int) -> None:
            sid = await client.create_session()
            for i in range(5):
                key = f"k{s}-{i}"
                text = f"/write n{s}_{i}=v{i} written" if i % 2 else f"/stream 4 1 turn {s} {i}"
                first = await submit(client, sid, key, text)
                assert first["__typename"] == "TurnAccepted", first
                await client.wait_for_status(first["turn"]["id"], {"COMPLETED"})
                inputs[key] = (sid, text)

        await asyncio.gather(*(session_of_turns(s) for s in range(8)))
        ids = {
            r["idempotency_key"]: str(r["id"])
            for r in await db.fetch("SELECT id, idempotency_key FROM turns")
        }
        per_turn = {
            str(r["turn_id"]): r["n"]
            for r in await db.fetch("SELECT turn_id, count(*) AS n FROM events GROUP BY turn_id")
        }
        assert len(ids) == 40 and set(per_turn) == set(ids.values())
        assert max(per_turn.values()) > 3  # streamed and tool turns: more than bare ones
        contents = {
            str(r["id"]): (r["input"], r["output"])
            for r in await db.fetch("SELECT id, input, output FROM turns")
        }
        # A turn that ended just now: kept by every pass, replayed as itself.
        sid = await client.create_session()
        recent = await submit(client, sid, "recent", "hello")
        await client.wait_for_status(recent["turn"]["id"], {"COMPLETED"})
        keys_before = await db.fetchval("SELECT count(*) FROM session_keys")
        # Blanking keeps every event: the count is the record's from here on.
        events_all = await db.fetchval("SELECT count(*) FROM events")

        # The forty ended three days ago, in one statement and a second
        # apart: the next pass of serve's own timer finds all of them at once,
        # oldest first, ten a batch.
        await db.execute(
            "UPDATE turns t SET completed_at = now() - interval '3 days' + o.n * interval '1 s' "
            "FROM (SELECT id, row_number() OVER (ORDER BY completed_at, id) AS n FROM turns "
            "      WHERE idempotency_key <> 'recent') o "
            "WHERE o.id = t.id"
        )
        oldest = [
            str(r["id"])
            for r in await db.fetch(
                "SELECT id FROM turns WHERE idempotency_key <> 'recent' ORDER BY completed_at"
            )
        ]

        code = await asyncio.to_thread(server.proc.wait, 60)
        assert code == -signal.SIGKILL, server.log()
        assert f"crash hook: SIGKILL at prune_batch (call {KILLED_IN})" in server.log()
    finally:
        await client.close()
        if server.proc.poll() is None:
            stop_process(server)

    # Batches 0 and 1 committed; batch 2 had removed its ten turns when the
    # process died, and rolled back whole: its turns are there with their
    # input and output, their events untouched.
    committed = set(oldest[: 10 * KILLED_IN])
    stones = {
        str(r["turn_id"]): r["idempotency_key"]
        for r in await db.fetch("SELECT turn_id, idempotency_key FROM key_tombstones")
    }
    assert set(stones) == committed
    kept = {
        str(r["id"]): (r["input"], r["output"])
        for r in await db.fetch("SELECT id, input, output FROM turns")
    }
    assert set(kept) == set(ids.values()) - committed | {recent["turn"]["id"]}
    assert all(kept[t] == contents[t] for t in contents if t not in committed)
    assert all(contents[t][1] for t in contents)  # every turn had an output
    # Every key in exactly one place; no event lost, none half blanked.
    assert not set(stones.values()) & set(
        await db.fetchval("SELECT coalesce(array_agg(idempotency_key), '{}') FROM turns")
    )
    assert await db.fetchval("SELECT count(*) FROM session_keys") == keys_before
    blanked = await db.fetch("SELECT data FROM events WHERE turn_id IS NULL")
    assert len(blanked) == sum(per_turn[t] for t in committed)
    assert all(r["data"] == '{"pruned": true}' for r in blanked)
    assert not await db.fetchval(
        "SELECT count(*) FROM events WHERE turn_id IS NOT NULL AND data = '{\"pruned\": true}'"
    )

    # Restarted without the hook, serve's own timer finishes the backlog.
    server = start_server_process(database_url, tmp_path, env=SWEEPING, name="restarted")
    client = GraphQLClient(server.url)
    try:
        await _wait_for(db, "SELECT count(*) FROM key_tombstones", 40, server)
        assert await db.fetchval("SELECT count(*) FROM events") == events_all
        gaps = await db.fetchval(
            "SELECT count(*) FROM (SELECT session_id, count(*) AS n, max(seq) AS top "
            "FROM events GROUP BY session_id) s WHERE n <> top"
        )
        assert gaps == 0
        assert await db.fetchval(
            "SELECT count(*) FROM events WHERE turn_id IS NULL AND data = '{\"pruned\": true}'"
        ) == sum(per_turn.values())
        # Each key answers KeyExpired naming its own turn, with its request or
        # another; never a new turn. The recent key replays its turn.
        for key, (session, text) in inputs.items():
            for sent in (text, "something else"):
                answer = await submit(client, session, key, sent)
                assert answer["__typename"] == "KeyExpired", (key, answer)
                assert answer["turnId"] == ids[key]
        assert await db.fetchval("SELECT count(*) FROM turns") == 1
        again = await submit(client, sid, "recent", "hello")
        assert again["__typename"] == "TurnReplayed" and again["turn"]["id"] == recent["turn"]["id"]
    finally:
        await client.close()
        stop_process(server)


async def _retention_on_metrics(server: ServerProcess) -> tuple[dict[str, float], float]:
    """keyturn_retention_pruned_total by what, and keyturn_retention_passes_total,
    as the server's /metrics says them now (a label not yet counted is 0)."""
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    pruned = {"turns": 0.0, "events": 0.0, "tombstones": 0.0}
    passes = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "keyturn_retention_pruned_total":
                pruned[sample.labels["what"]] = sample.value
            elif sample.name == "keyturn_retention_passes_total":
                passes = sample.value
    return pruned, passes


async def test_a_servers_own_sweeper_moves_the_retention_counters_its_metrics_show(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, env=SWEEPING, name="scraped")
    try:
        # Nothing to prune yet: the passes find nothing and count none.
        assert (await _retention_on_metrics(server))[0] == {
            "turns": 0,
            "events": 0,
            "tombstones": 0,
        }
        # Thirty turns to prune (three events each) and two tombstones to forget.
        await seed_backlog(db, sessions=3, turns_per_session=10, ended_ago=timedelta(days=3))
        await db.execute(
            "INSERT INTO key_tombstones (session_id, idempotency_key, fingerprint, turn_id, "
            "ended_at, expired_at, pruned_at) SELECT id, k, 'fp', gen_random_uuid(), "
            "now() - interval '40 days', now() - interval '40 days', "
            "now() - interval '31 days' "
            "FROM (SELECT id FROM sessions LIMIT 1) s, unnest(ARRAY['gone-1', 'gone-2']) k"
        )
        await _wait_for(
            db,
            "SELECT count(*) FROM key_tombstones WHERE idempotency_key NOT LIKE 'gone-%' "
            "AND NOT EXISTS (SELECT 1 FROM turns) "
            "AND NOT EXISTS (SELECT 1 FROM key_tombstones WHERE idempotency_key LIKE 'gone-%')",
            30,
            server,
        )
        # Each batch is counted once it has committed: the scrape catches up
        # with what the record already shows.
        async with asyncio.timeout(20):
            while (seen := await _retention_on_metrics(server))[0] != {  # noqa: ASYNC110 - a scrape
                "turns": 30,
                "events": 90,
                "tombstones": 2,
            }:
                await asyncio.sleep(0.1)
        assert seen[1] >= 1
    finally:
        stop_process(server)


def test_doctor_publishes_the_policy(database_url: str, tmp_path: Path) -> None:
    result = keyturn(
        "doctor", cwd=tmp_path, settings={"KEYTURN_DATABASE_URL": database_url, **RETENTION}
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("ok    retention: "))
    assert "a key answers replays until 1h after its turn ended, then KeyExpired" in line
    assert "turns are pruned 1d after they ended" in line
    assert "tombstones are forgotten 30d after their turn was pruned" in line
    assert "the same key names a new turn" in line

    default = keyturn("doctor", cwd=tmp_path, settings={"KEYTURN_DATABASE_URL": database_url})
    assert (
        "ok    retention: keys answer replays forever; turns are kept forever; "
        "no tombstones are made" in default.stdout
    )


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"KEYTURN_KEY_RETENTION": "3 weeks"},
            "KEYTURN_KEY_RETENTION '3 weeks' is not a retention",
        ),
        ({"KEYTURN_TOMBSTONE_RETENTION": "0d"}, "KEYTURN_TOMBSTONE_RETENTION '0d' is not a"),
        (
            {"KEYTURN_KEY_RETENTION": "1d", "KEYTURN_TURN_RETENTION": "1h"},
            "KEYTURN_TURN_RETENTION (1h) must be at least KEYTURN_KEY_RETENTION (1d)",
        ),
        (
            {"KEYTURN_TURN_RETENTION": "30d"},
            "KEYTURN_TURN_RETENTION (30d) needs KEYTURN_KEY_RETENTION",
        ),
    ],
)
@pytest.mark.parametrize("command", [("serve",), ("prune",)])
def test_a_retention_that_cannot_be_kept_stops_with_one_line(
    tmp_path: Path, settings: dict[str, str], expected: str, command: tuple[str, ...]
) -> None:
    # No database is needed to refuse: nothing starts.
    result = keyturn(
        *command, cwd=tmp_path, settings={"KEYTURN_DATA_DIR": str(tmp_path / "none"), **settings}
    )
    line = one_clean_line(result, code=result.returncode)
    assert result.returncode in (1, 2)
    assert expected in line, line
    assert not (tmp_path / "none").exists()

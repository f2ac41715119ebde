"""``keyturn prune`` as an operator runs it: --dry-run says what a pass would
remove and removes nothing; a pass SIGKILLed mid-way and run again ends with
the record one clean pass leaves; doctor publishes the policy; a retention
that is not one stops the command with one line."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.clirun import clean_env, one_clean_line
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


async def test_a_pass_killed_mid_way_and_run_again_leaves_the_record_of_one_clean_pass(
    database_url: str, db: Any, tmp_path: Path
) -> None:
    sessions, per = 40, 50
    total = sessions * per
    await seed_backlog(db, sessions=sessions, turns_per_session=per, ended_ago=timedelta(days=3))
    events = await db.fetchval("SELECT count(*) FROM events")
    env = clean_env(KEYTURN_DATABASE_URL=database_url, KEYTURN_RETENTION_BATCH="10", **RETENTION)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keyturn",
        "prune",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Killed as soon as its first batches are committed.
        for _ in range(6000):
            if await db.fetchval("SELECT count(*) FROM key_tombstones") > 0:
                break
            if proc.returncode is not None:
                break
            await asyncio.sleep(0.01)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)

    # Whatever the kill interrupted rolled back whole: every key is in exactly
    # one place, and a turn's events were blanked with it or not at all.
    left = await db.fetchval("SELECT count(*) FROM turns")
    stones = await db.fetchval("SELECT count(*) FROM key_tombstones")
    assert left + stones == total and stones > 0
    blanked = await db.fetchval("SELECT count(*) FROM events WHERE turn_id IS NULL")
    assert blanked == 3 * stones

    again = await asyncio.to_thread(
        keyturn, "prune", cwd=tmp_path, settings={"KEYTURN_DATABASE_URL": database_url, **RETENTION}
    )
    assert again.returncode == 0, again.stderr
    assert f"pruned {left} turns ({3 * left} events blanked" in again.stdout
    await assert_backlog_pruned(db, turns=total, events=events)


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

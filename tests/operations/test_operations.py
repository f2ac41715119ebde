"""The operator's view: /metrics, /healthz and /readyz, JSON logs with request
ids, and ``keyturn doctor`` — each through a real server or a real process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from keyturn.db.migrate import head_revision
from tests.support import (
    SESSION_EVENTS,
    GraphQLClient,
    admin,
    free_port,
    request,
    serve_in_process,
    start_server_process,
    stop_process,
    with_database,
    ws_session,
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def admissions(m: dict[Any, float], outcome: str) -> float:
    return m.get(("keyturn_admissions_total", (("outcome", outcome),)), 0.0)


async def test_metrics_count_admissions_turns_subscriptions_and_pool(database_url: str) -> None:
    async with serve_in_process(database_url) as srv, httpx.AsyncClient(base_url=srv.url) as http:
        client = GraphQLClient(srv.url)
        before = samples((await http.get("/metrics")).text)
        sid = await client.create_session()
        first = await client.submit(sid, "k", "hello")
        await client.submit(sid, "k", "hello")
        await client.submit(sid, "k", "changed")
        await client.wait_for_status(first["turn"]["id"], {"COMPLETED"})
        async with ws_session(srv.ws_url) as ws:
            stream = ws.subscribe(request(SESSION_EVENTS, s=sid, a=0))
            await anext(stream)  # subscribed
            response = await http.get("/metrics")
            await stream.aclose()
        assert response.headers["content-type"].startswith("text/plain")
        after = samples(response.text)
        for outcome in ("accepted", "replayed", "conflict"):
            assert admissions(after, outcome) - admissions(before, outcome) == 1
        count = ("keyturn_admission_seconds_count", ())
        assert after[count] - before.get(count, 0) == 3
        assert after[("keyturn_turns", (("status", "COMPLETED"),))] == 1
        assert after[("keyturn_turns", (("status", "QUEUED"),))] == 0
        assert after[("keyturn_subscriptions_open", ())] == 1
        assert after[("keyturn_pool_connections_size", ())] >= 1
        assert ("keyturn_pool_connections_in_use", ()) in after
        assert ("keyturn_interruptions_total", ()) in after
        await client.close()


@pytest.mark.slow
async def test_metrics_with_several_workers_sum_every_process(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, workers=2)
    try:
        client = GraphQLClient(server.url)
        sid = await client.create_session()
        for i in range(12):
            # A fresh connection each time, so that both workers admit some.
            async with httpx.AsyncClient(base_url=server.url) as one:
                await one.post(
                    "/graphql",
                    json={
                        "query": "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) "
                        "{ __typename } }",
                        "variables": {
                            "i": {"sessionId": sid, "idempotencyKey": f"k{i}", "input": "x"}
                        },
                    },
                )
        owners = set()
        for _ in range(6):  # whichever worker answers, the sum is the same
            async with httpx.AsyncClient(base_url=server.url) as one:
                m = samples((await one.get("/metrics")).text)
                owners.add((await one.get("/healthz")).json()["owner"])
            assert admissions(m, "accepted") == 12
        await client.close()
    finally:
        stop_process(server)


async def test_healthz_alive_readyz_checks_database_and_migrations(database_url: str) -> None:
    async with serve_in_process(database_url) as srv, httpx.AsyncClient(base_url=srv.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["revision"] == head_revision()
        conn = await admin(database_url)
        try:
            await conn.execute("UPDATE alembic_version SET version_num = '0000_older'")
            behind = await http.get("/readyz")
            assert behind.status_code == 503 and behind.json()["status"] == "migrations behind"
            assert (await http.get("/healthz")).status_code == 200  # alive all the same
            await conn.execute("UPDATE alembic_version SET version_num = $1", head_revision())
        finally:
            await conn.close()
        assert (await http.get("/readyz")).status_code == 200
        # Draining: alive, not ready.
        srv.app.state.runtime.drain()
        assert (await http.get("/readyz")).status_code == 503


@pytest.mark.slow
async def test_json_logs_carry_request_id_and_admission_fields_never_the_input(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, env={"KEYTURN_LOG_LEVEL": "info"})
    secret = f"SECRET-{uuid.uuid4().hex}"
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            client = GraphQLClient(server.url)
            sid = await client.create_session()
            response = await http.post(
                "/graphql",
                headers={"x-request-id": "req-abc.123"},
                json={
                    "query": "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) "
                    "{ ... on TurnAdmission { turn { id } } } }",
                    "variables": {"i": {"sessionId": sid, "idempotencyKey": "k1", "input": secret}},
                },
            )
            assert response.headers["x-request-id"] == "req-abc.123"
            turn_id = response.json()["data"]["submitTurn"]["turn"]["id"]
            generated = (await http.post("/graphql", json={"query": "{ __typename }"})).headers
            assert len(generated["x-request-id"]) == 32
            insane = await http.get("/healthz", headers={"x-request-id": "bad id; drop table"})
            assert insane.headers["x-request-id"] != "bad id; drop table"
            await client.close()
    finally:
        stop_process(server)
    lines = [line for line in server.log().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    admitted = [r for r in records if r["message"] == "admission accepted"]
    assert admitted, records
    assert admitted[0]["request_id"] == "req-abc.123"
    assert admitted[0]["session_id"] == sid and admitted[0]["turn_id"] == turn_id
    assert admitted[0]["idempotency_key"] == "k1"
    access = [r for r in records if r["logger"] == "keyturn.http.requestlog"]
    assert any(r["request_id"] == "req-abc.123" and r["status"] == 200 for r in access)
    assert secret not in server.log()


@pytest.mark.slow
async def test_log_level_warning_writes_no_line_per_request(
    database_url: str, tmp_path: Path
) -> None:
    """KEYTURN_LOG_LEVEL is the level of Keyturn's own lines too: at warning,
    requests and admissions write nothing; what went wrong still does."""
    server = start_server_process(database_url, tmp_path, env={"KEYTURN_LOG_LEVEL": "warning"})
    try:
        client = GraphQLClient(server.url)
        sid = await client.create_session()
        await client.submit(sid, "k1", "hello")
        async with httpx.AsyncClient(base_url=server.url) as http:
            # A client's mistake is answered, not logged.
            assert (await http.post("/graphql", json={"query": "{ nope }"})).status_code == 200
        await client.close()
    finally:
        stop_process(server)
    records = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert [r for r in records if r["level"] in ("DEBUG", "INFO")] == [], records


def doctor(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "keyturn", "doctor"],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
async def test_doctor_passes_on_a_good_installation_and_names_each_failure(
    database_url: str, server_url: str, tmp_path: Path
) -> None:
    good = await asyncio.to_thread(doctor, {"KEYTURN_DATABASE_URL": database_url}, tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    for name in ("settings", "database", "database version", "migrations", "clock skew"):
        assert any(
            line.startswith("ok") and f" {name}:" in line for line in good.stdout.splitlines()
        )

    empty = f"keyturn_doc_{uuid.uuid4().hex[:8]}"
    conn = await admin(server_url)
    await conn.execute(f'CREATE DATABASE "{empty}"')
    try:
        behind = await asyncio.to_thread(
            doctor, {"KEYTURN_DATABASE_URL": with_database(server_url, empty)}, tmp_path
        )
        assert behind.returncode == 1
        assert "fail  migrations: at none" in behind.stdout
    finally:
        await conn.execute(f'DROP DATABASE "{empty}" WITH (FORCE)')
        await conn.close()

    down = await asyncio.to_thread(
        doctor,
        {"KEYTURN_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/x"},
        tmp_path,
    )
    assert down.returncode == 1 and "fail  database: cannot connect" in down.stdout

    bad = await asyncio.to_thread(
        doctor,
        {"KEYTURN_DATABASE_URL": database_url, "KEYTURN_LEASE_RENEW_S": "30"},
        tmp_path,
    )
    assert bad.returncode == 1 and "fail  settings: KEYTURN_LEASE_RENEW_S" in bad.stdout

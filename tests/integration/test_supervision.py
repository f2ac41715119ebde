"""Every long-lived task of a process is watched: one that dies is logged and
started again, and while it is down /readyz says 503 and names it."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from keyturn.db import planner
from keyturn.db.listener import Listener
from keyturn.http import metrics
from tests.support import InProcessServer


class Boom(RuntimeError):
    """An error no background task expects."""


def fail_once(original: Callable[..., Any]) -> tuple[Callable[..., Any], list[int]]:
    """A stand-in that raises the first time it is called, then behaves."""
    calls: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Boom("injected failure")
        return original(*args, **kwargs)

    return wrapper, calls


def break_task(name: str, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make one step of the named task fail once, and make that step happen."""
    if name == "worker":
        wrapper, calls = fail_once(runtime.worker._claim)
        monkeypatch.setattr(runtime.worker, "_claim", wrapper)
        runtime.worker.wake()
    elif name == "bus-poll":
        wrapper, calls = fail_once(runtime.bus._poll_once)
        monkeypatch.setattr(runtime.bus, "_poll_once", wrapper)
    elif name == "listener":
        # The connection is lost and opening it again fails in a way the
        # listener does not expect.
        wrapper, calls = fail_once(runtime.listener._connect)
        monkeypatch.setattr(runtime.listener, "_connect", wrapper)
        runtime.listener._lost.set()
    elif name == "notifier":
        wrapper, calls = fail_once(runtime.listener._send)
        monkeypatch.setattr(runtime.listener, "_send", wrapper)
        runtime.listener.wake(uuid.uuid4())
    elif name == "auth-watch":
        auth = next(
            getattr(spec.run, "__self__", None)
            for spec in runtime.supervisor._tasks.values()
            if spec.name == "auth-watch"
        )
        assert auth is not None
        wrapper, calls = fail_once(auth._recheck)
        monkeypatch.setattr(auth, "_recheck", wrapper)
    elif name == "metrics-sampler":
        wrapper, calls = fail_once(metrics.sample)
        monkeypatch.setattr(metrics, "sample", wrapper)
    elif name == "statistics":
        # The task looks every second.
        wrapper, calls = fail_once(planner.sizes)
        monkeypatch.setattr(planner, "sizes", wrapper)
    else:
        raise AssertionError(name)
    return calls


TASKS = [
    "worker",
    "bus-poll",
    "listener",
    "notifier",
    "statistics",
    "auth-watch",
    "metrics-sampler",
]


def test_every_background_task_is_supervised(server: InProcessServer) -> None:
    assert sorted(server.app.state.runtime.supervisor.restarts()) == sorted(TASKS)


@pytest.mark.parametrize("name", TASKS)
async def test_a_task_that_dies_is_restarted_and_readyz_names_it_meanwhile(
    name: str,
    server: InProcessServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = server.app.state.runtime
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        assert (await http.get("/readyz")).status_code == 200
        with caplog.at_level(logging.ERROR, logger="keyturn.runtime.supervisor"):
            calls = break_task(name, runtime, monkeypatch)
            seen_down = None
            deadline = time.monotonic() + 15
            while seen_down is None and time.monotonic() < deadline:
                answer = await http.get("/readyz")
                if answer.status_code == 503:
                    seen_down = answer.json()
                await asyncio.sleep(0.02)
        assert seen_down is not None, f"{name} never showed as down"
        assert seen_down["down"] == [name]
        assert f"background task {name} died" in caplog.text
        assert "Boom: injected failure" in caplog.text

        # Started again: it runs its step once more, and the process is ready.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if len(calls) >= 2 and (await http.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{name} did not recover: {(await http.get('/readyz')).text}")
    assert runtime.supervisor.restarts()[name] == 1


async def test_the_claim_loop_ending_on_drain_is_not_a_death(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = server.app.state.runtime
    with caplog.at_level(logging.INFO, logger="keyturn.runtime.supervisor"):
        runtime.drain()
        deadline = time.monotonic() + 10
        while "background task worker finished" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a restart would come after 0.2 s
    assert runtime.supervisor.restarts()["worker"] == 0
    assert "died" not in caplog.text
    assert runtime.supervisor.down() == []


async def test_a_cancel_that_lands_with_the_health_checks_answer_still_stops_the_listener(
    database_url: str,
) -> None:
    # With no wait between them, the listener checks its connection with
    # one SELECT 1 after another; a stop then lands now and then in the
    # step of the loop where a check's answer arrives. Such a cancel once
    # went unseen, and the loop went on checking: the process's shutdown
    # waited for it without end.
    listener = Listener(
        database_url, on_wake=lambda _s: None, on_reconnect=lambda: None, health_check_s=0
    )
    await listener.start()
    try:
        for n in range(300):
            loop = asyncio.create_task(listener.supervise())
            for _ in range(n % 11):
                await asyncio.sleep(0)
            loop.cancel()
            done, _ = await asyncio.wait({loop}, timeout=5)
            assert done, f"the listener's loop went on after its cancel (round {n})"
            assert loop.cancelled()
    finally:
        await listener.stop()

"""The supervisor's rules, on plain coroutines: a task that dies is started
again and counts as down until it has run a while; one that finishes is done."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from keyturn.runtime.supervisor import Supervisor


async def until(condition: Callable[[], bool], within: float = 10) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 (the state is plain attributes)
            await asyncio.sleep(0.005)


async def test_a_task_that_dies_is_restarted_and_down_until_it_settles() -> None:
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("first run fails")
        await asyncio.Event().wait()

    sup = Supervisor(backoff_s=0.05, settle_s=0.5)
    sup.add("flaky", flaky)
    sup.start()
    try:
        await until(lambda: sup.restarts()["flaky"] == 1)
        assert sup.down() == ["flaky"]  # dead, waiting for its backoff
        await until(lambda: runs == 2)
        assert sup.down() == ["flaky"]  # running again, not settled yet
        await until(lambda: not sup.down())
        assert runs == 2 and sup.restarts() == {"flaky": 1}
    finally:
        await sup.stop()


async def test_a_task_that_finishes_is_neither_restarted_nor_down() -> None:
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    sup = Supervisor(backoff_s=0.01)
    sup.add("once", once)
    sup.start()
    await asyncio.sleep(0.1)
    assert runs == 1 and sup.down() == [] and sup.restarts() == {"once": 0}
    await sup.stop()


async def test_a_task_that_keeps_dying_keeps_being_restarted_and_stays_down() -> None:
    runs = 0

    async def broken() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("always")

    sup = Supervisor(backoff_s=0.01, max_backoff_s=0.02)
    sup.add("broken", broken)
    sup.start()
    await until(lambda: runs >= 4)
    assert sup.down() == ["broken"] and sup.restarts()["broken"] >= 3
    await sup.stop()


async def test_a_task_added_after_start_runs_at_once() -> None:
    ran = asyncio.Event()

    async def late() -> None:
        ran.set()
        await asyncio.Event().wait()

    sup = Supervisor()
    sup.start()
    sup.add("late", late)
    await asyncio.wait_for(ran.wait(), 1)
    await sup.stop()

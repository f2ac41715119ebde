"""Waits with a time limit (keyturn.waits): an answer in time is returned, a
late one times out, and a cancel that lands in the same step as the answer
still cancels the waiter (Python 3.11's ``asyncio.wait_for`` returned the
answer and lost the cancel: a claim loop ran on, a turn whose tool answered
as it was cancelled went on to its next step)."""

from __future__ import annotations

import asyncio

import pytest

from keyturn.waits import set_within, within


async def _answer(future: asyncio.Future[str]) -> str:
    return await future


async def test_an_answer_in_time_is_returned_and_a_late_one_times_out() -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.01, ready.set_result, "applied")
    assert await within(_answer(ready), 5) == "applied"

    never: asyncio.Future[str] = loop.create_future()
    with pytest.raises(TimeoutError):
        await within(_answer(never), 0.05)
    assert never.cancelled(), "the late call was not cancelled"


async def test_a_cancel_that_lands_as_the_call_answers_still_cancels() -> None:
    loop = asyncio.get_running_loop()
    for _ in range(3):
        answer: asyncio.Future[str] = loop.create_future()
        waiter = asyncio.create_task(within(_answer(answer), 30))
        await asyncio.sleep(0)  # the waiter is waiting on the call
        answer.set_result("applied")  # the answer and the cancel in one step
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter


async def test_an_event_set_in_time_and_one_never_set() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await set_within(event, 5) is True
    assert await set_within(asyncio.Event(), 0.05) is False


async def test_a_cancel_that_lands_as_the_event_is_set_still_cancels() -> None:
    for _ in range(3):
        event = asyncio.Event()
        waiter = asyncio.create_task(set_within(event, 30))
        await asyncio.sleep(0)
        event.set()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

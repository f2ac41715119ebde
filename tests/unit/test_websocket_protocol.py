"""The light queue and flag keyturn.http.websockets gives uvicorn's protocol
behave as the asyncio.Queue and asyncio.Event they replace, for the way the
protocol uses them."""

from __future__ import annotations

import asyncio

import pytest

from keyturn.http.websockets import _Flag, _Inbox


async def test_inbox_hands_messages_over_in_order_and_wakes_its_reader() -> None:
    inbox = _Inbox()
    assert inbox.empty()
    inbox.put_nowait("a")
    inbox.put_nowait("b")
    assert not inbox.empty()
    assert await inbox.get() == "a"
    reader = asyncio.ensure_future(inbox.get())  # "b" is still there
    assert await reader == "b"
    assert inbox.empty()
    waiting = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    inbox.put_nowait("c")
    assert await asyncio.wait_for(waiting, 1) == "c"


async def test_a_cancelled_read_loses_nothing() -> None:
    inbox = _Inbox()
    waiting = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    inbox.put_nowait("kept")
    assert await asyncio.wait_for(inbox.get(), 1) == "kept"


async def test_flag_releases_every_waiter_when_set_and_holds_them_while_clear() -> None:
    flag = _Flag()
    flag.set()
    assert await asyncio.wait_for(flag.wait(), 1)
    flag.clear()
    waiters = [asyncio.ensure_future(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    flag.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True, True, True]

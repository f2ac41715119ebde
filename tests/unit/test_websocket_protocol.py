"""The light queue and flag keyturn.http.websockets gives uvicorn's protocol
behave as the asyncio.Queue and asyncio.Event they replace, for the way the
protocol uses them."""

from __future__ import annotations

import asyncio

import pytest

from keyturn.http.transport import Coalesced
from keyturn.http.websockets import _Flag, _Inbox
from tests.support.transports import Recording


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


async def test_frames_sent_in_one_pass_reach_the_socket_in_one_write_in_order() -> None:
    accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        counting = Recording(await accepted)
        out = Coalesced(counting, asyncio.get_running_loop())  # type: ignore[arg-type]
        out.write(b"next;")
        out.write(b"complete;")
        assert len(counting.writes) == 0  # not before the pass ends
        await asyncio.sleep(0)
        assert len(counting.writes) == 1
        out.write(b"later;")
        out.close()  # what is pending goes first, then the close
        assert len(counting.writes) == 2
        assert await asyncio.wait_for(reader.read(), 5) == b"next;complete;later;"
    finally:
        writer.close()
        server.close()

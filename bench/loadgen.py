"""A small HTTP/1.1 keep-alive client for what wrk cannot do: an open-loop
fixed-rate run (latency measured from each request's scheduled start, so a
slow server cannot hide its queueing), a sequential page walk, and a
closed-loop fallback when wrk is not installed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Request = tuple[str, str, dict[str, str], bytes]  # method, path, headers, body
MakeRequest = Callable[[int], Request]  # the n-th request of a run


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, req: Request) -> tuple[int, bytes]:
        if self._writer is None:
            await self._open()
        assert self._reader is not None and self._writer is not None
        method, path, headers, body = req
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self._reader.readexactly(length) if length else b""
        return status, payload

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


@dataclass
class Result:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    errors: int = 0

    def count(self, label: str) -> None:
        self.statuses[label] = self.statuses.get(label, 0) + 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


Classify = Callable[[int, bytes], str]


async def closed_loop(
    host: str,
    port: int,
    make: MakeRequest,
    classify: Classify,
    *,
    concurrency: int,
    duration_s: float,
) -> Result:
    """``concurrency`` connections, each sending its next request as soon as
    the previous answer arrives, for ``duration_s``."""
    result = Result()
    counter = iter(range(1 << 62))
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        conn = Connection(host, port)
        try:
            while time.perf_counter() < deadline:
                req = make(next(counter))
                start = time.perf_counter()
                try:
                    status, body = await conn.request(req)
                except (OSError, asyncio.IncompleteReadError):
                    result.errors += 1
                    conn.close()
                    continue
                result.latencies_ms.append((time.perf_counter() - start) * 1000)
                result.count(classify(status, body))
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - start
    return result


async def open_loop(
    host: str,
    port: int,
    make: MakeRequest,
    classify: Classify,
    *,
    rate: float,
    duration_s: float,
    max_connections: int = 512,
) -> Result:
    """Requests start at a fixed rate whatever the server does; each latency
    runs from the request's scheduled start to its answer."""
    result = Result()
    idle: list[Connection] = []
    opened = 0
    total = max(1, int(rate * duration_s))
    interval = 1.0 / rate
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int, scheduled: float) -> None:
        nonlocal opened
        conn = idle.pop() if idle else None
        reused = conn is not None
        if conn is None:
            opened += 1
            conn = Connection(host, port)
        try:
            status, body = await conn.request(make(n))
        except (OSError, asyncio.IncompleteReadError):
            conn.close()
            if not reused:
                result.errors += 1
                return
            # The server closed an idle keep-alive connection: once more on a new one.
            conn = Connection(host, port)
            try:
                status, body = await conn.request(make(n))
            except (OSError, asyncio.IncompleteReadError):
                result.errors += 1
                conn.close()
                return
        result.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
        result.count(classify(status, body))
        idle.append(conn)

    start = time.perf_counter()
    for n in range(total):
        scheduled = start + n * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if opened - len(idle) >= max_connections and not idle:
            result.errors += 1  # the server fell so far behind that we gave up on this one
            continue
        task = asyncio.create_task(one(n, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)
    result.elapsed_s = time.perf_counter() - start
    for conn in idle:
        conn.close()
    return result

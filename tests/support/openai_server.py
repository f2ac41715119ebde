"""An OpenAI-compatible model server of the tests' own: chat completions
streamed as server-sent events (``data: {chunk}`` lines, then
``data: [DONE]``), with text deltas and tool calls, and ``GET /v1/models``.

A test scripts it: replies queued in order (one per request, retries
included), else ``respond`` (by default, an echo of the last user message).
Every request it receives is kept, so a test can look at the messages sent,
or see that none was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keyturn.ops.serverproc import bound_socket


@dataclass(frozen=True)
class Call:
    """A tool call the scripted model makes; its arguments are streamed in two
    fragments (as real servers split them), the name in the first."""

    id: str
    name: str
    arguments: str  # the JSON text, sent as it is


@dataclass(frozen=True)
class Reply:
    """One answer to one request."""

    text: Sequence[str] = ()  # the text deltas, one chunk each
    calls: Sequence[Call] = ()
    status: int = 200  # anything else: an error body with this status
    error: str = "scripted failure"
    # Seconds to wait before answering at all, or after the first chunk.
    stall_s: float = 0.0
    stall_after_first_s: float = 0.0
    # Data lines sent as they are, instead of chunks built from the above.
    raw: Sequence[str] | None = None


def text(*parts: str) -> Reply:
    return Reply(text=parts)


def _echo(body: dict[str, Any]) -> Reply:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    last = users[-1]["content"] if users else ""
    return Reply(text=("echo: ", str(last)))


@dataclass
class ModelServer:
    """The running server: its address, its script and what it was sent."""

    url: str
    models: list[str]
    queue: list[Reply] = field(default_factory=list)
    respond: Callable[[dict[str, Any]], Reply] = _echo
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    model_listings: int = 0

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def script(self, *replies: Reply) -> None:
        self.queue.extend(replies)

    @property
    def completions(self) -> int:
        return len(self.requests)

    def next_reply(self, body: dict[str, Any]) -> Reply:
        return self.queue.pop(0) if self.queue else self.respond(body)


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _lines(model: str, reply: Reply) -> list[str]:
    if reply.raw is not None:
        return list(reply.raw)
    lines = [_chunk(model, {"role": "assistant", "content": ""})]
    lines += [_chunk(model, {"content": piece}) for piece in reply.text]
    for index, call in enumerate(reply.calls):
        half = len(call.arguments) // 2
        first = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments[:half]},
        }
        rest = {"index": index, "function": {"arguments": call.arguments[half:]}}
        lines.append(_chunk(model, {"tool_calls": [first]}))
        lines.append(_chunk(model, {"tool_calls": [rest]}))
    lines.append(_chunk(model, {}, "tool_calls" if reply.calls else "stop"))
    return [*lines, "[DONE]"]


def _app(state: ModelServer) -> Starlette:
    async def completions(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        state.requests.append(body)
        state.headers.append(dict(request.headers))
        reply = state.next_reply(body)
        if reply.stall_s:
            await asyncio.sleep(reply.stall_s)
        if reply.status != 200:
            return JSONResponse(
                {"error": {"message": reply.error, "type": "server_error", "code": None}},
                status_code=reply.status,
                # The SDK waits this long before its retry: tests stay quick.
                headers={"retry-after-ms": "20"},
            )
        model = str(body.get("model", ""))

        async def events() -> AsyncIterator[bytes]:
            for n, line in enumerate(_lines(model, reply)):
                yield f"data: {line}\n\n".encode()
                if n == 0 and reply.stall_after_first_s:
                    await asyncio.sleep(reply.stall_after_first_s)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(_request: Request) -> Response:
        state.model_listings += 1
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "tests"}
                    for m in state.models
                ],
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@contextlib.asynccontextmanager
async def serve_model(models: Sequence[str] = ("test-model",)) -> AsyncIterator[ModelServer]:
    """The server under uvicorn on a free port, on the test's own loop."""
    sock = bound_socket()
    port = int(sock.getsockname()[1])
    state = ModelServer(url=f"http://127.0.0.1:{port}", models=list(models))
    config = uvicorn.Config(
        _app(state), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield state
    finally:
        server.should_exit = True
        # A stalled stream must not hold the shutdown.
        server.force_exit = True
        await asyncio.wait_for(task, 30)
        sock.close()

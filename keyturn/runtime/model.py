"""The model seam, and the deterministic offline fixture that fills it.

A model implements :class:`Model`: it is told the turn's history setting
(``mode``), given the earlier turns that setting lets it see, and streams its
reply round by round, asking for tool calls between rounds. The
fixture gives the same output for the same input, setting and history, byte for
byte, and understands a few directives for tests and demos:

``/sleep MS``  hold the turn MS milliseconds, then reply
``/fail``      end the turn with ``turn.failed``
``/stream N [MS]``  stream the reply in N pieces, MS milliseconds apart
                    (default 50); the pieces make up what ``reply`` gives
``/write NAME=VALUE``   call the ``synthetic_write`` tool (idempotent)
``/append NAME=VALUE``  call the ``synthetic_append`` tool (unsafe)
``/read NAME``          call the ``synthetic_read`` tool (read-only)
``/call NAME {JSON}``   call any tool by name, the JSON object (on one line)
                        its arguments; without one the arguments are ``{}``.
                        Arguments that are not a JSON object fail the turn

Tool directives may follow one another anywhere in the input; each is one
call, made in the order written, before the reply.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from keyturn.domain import History, TurnStatus
from keyturn.errors import ModelError


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model is told about one tool it may call."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A tool call the model asks for. ``call_id`` is the model's own name for
    the call (an OpenAI ``tool_call_id``), carried back with its result; it is
    not part of what makes two calls the same."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one call returned, as the model is shown it."""

    index: int
    tool: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    call_id: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class PastTurn:
    input: str
    output: str | None
    status: TurnStatus  # COMPLETED, INTERRUPTED or CANCELLED
    # The calls the turn made whose results the record holds.
    tools: tuple[ToolOutcome, ...] = ()


@dataclass(frozen=True, slots=True)
class Round:
    """One earlier round of the turn being produced: the text the model
    streamed in it, then the calls it asked for and what they returned."""

    text: str
    outcomes: tuple[ToolOutcome, ...]


# Where a model streams its text: each piece as it is produced, in order.
Emit = Callable[[str], Awaitable[None]]


class Model(Protocol):
    async def step(
        self,
        *,
        input: str,
        mode: History,
        history: Sequence[PastTurn],
        rounds: Sequence[Round],
        tools: Sequence[ToolSpec],
        emit: Emit,
    ) -> list[ToolRequest]:
        """One round of the reply to ``input``: stream this round's text through
        ``emit`` as it is produced, then return the tool calls to make next,
        or [] when the reply is done. The runtime records and runs the calls
        in order and calls ``step`` again with one more round. ``tools`` are
        the tools this process offers.

        ``mode`` is the turn's history setting and ``history`` the earlier
        turns it shows (always empty under NONE). The turn's output is the
        concatenation of everything emitted, in every round. Raise ModelError
        to fail the turn."""
        ...


_SLEEP = re.compile(r"^/sleep\s+(\d{1,7})\b")
_STREAM = re.compile(r"^/stream\s+(\d{1,4})(?:\s+(\d{1,6}))?(?!\S)")
STREAM_PAUSE_MS = 50
_TOOL = re.compile(r"(?:^|(?<=\s))/(write|append)\s+([^\s=]+)=(\S*)|(?:^|(?<=\s))/read\s+(\S+)")
_TOOLS = {"write": "synthetic_write", "append": "synthetic_append"}


_CALL = re.compile(r"(?:^|(?<=\s))/call[ \t]+([^\s{]+)[ \t]*")


def _call_directives(input: str) -> list[tuple[int, int, ToolRequest]]:
    """``/call`` directives: where each starts and ends, and its call."""
    found: list[tuple[int, int, ToolRequest]] = []
    decoder = json.JSONDecoder()
    position = 0
    while match := _CALL.search(input, position):
        name, end = match.group(1), match.end()
        arguments: dict[str, Any] = {}
        # Only an object follows: raw_decode from "{" cannot give anything else.
        if end < len(input) and input[end] == "{":
            line_end = input.find("\n", end)
            line = input[: line_end if line_end >= 0 else len(input)]
            try:
                arguments, end = decoder.raw_decode(line, end)
            except json.JSONDecodeError as error:
                raise ModelError(
                    f"/call {name}: the arguments are not valid JSON on one line ({error.msg}"
                    f" at column {error.pos - match.end() + 1})"
                ) from None
        found.append((match.start(), end, ToolRequest(name, arguments)))
        position = end
    return found


def tool_directives(input: str) -> list[ToolRequest]:
    """The tool calls an input's directives ask for, in order. Raises
    ModelError for a ``/call`` whose arguments are not a JSON object."""
    placed = _call_directives(input)
    # Text inside a /call's JSON is its arguments, not more directives.
    spans = [(start, end) for start, end, _ in placed]
    for match in _TOOL.finditer(input):
        if any(start <= match.start() < end for start, end in spans):
            continue
        placed.append((match.start(), match.end(), _synthetic(match)))
    return [request for _, _, request in sorted(placed, key=lambda p: p[0])]


def _synthetic(match: re.Match[str]) -> ToolRequest:
    """The call of a /write, /append or /read directive."""
    if match.group(1):
        return ToolRequest(
            _TOOLS[match.group(1)], {"name": match.group(2), "value": match.group(3)}
        )
    return ToolRequest("synthetic_read", {"name": match.group(4)})


def _pieces(text: str, count: int) -> list[str]:
    """``text`` cut into ``count`` pieces of nearly equal length (fewer when
    it is shorter), in order."""
    count = max(1, min(count, len(text)))
    size, extra = divmod(len(text), count)
    pieces, start = [], 0
    for n in range(count):
        end = start + size + (1 if n < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def _digest(history: Sequence[PastTurn]) -> str:
    h = hashlib.sha256()
    for past in history:
        for part in (past.status, past.input, past.output or ""):
            h.update(part.encode())
            h.update(b"\x00")
    return h.hexdigest()[:12]


class FixtureModel:
    def __init__(self, *, delay_ms: int = 0) -> None:
        self.delay_ms = delay_ms

    async def step(
        self,
        *,
        input: str,
        mode: History,
        history: Sequence[PastTurn],
        rounds: Sequence[Round],
        tools: Sequence[ToolSpec],
        emit: Emit,
    ) -> list[ToolRequest]:
        # The directives name their tools; ``tools`` is not consulted.
        # Every directive in one round; once their results are in, reply.
        if not rounds:
            calls = tool_directives(input)
            if calls:
                return calls
        results = [outcome for round in rounds for outcome in round.outcomes]
        text = await self.reply(input=input, mode=mode, history=history, results=results)
        stream = _STREAM.match(input)
        if stream is None:
            await emit(text)
            return []
        pause = int(stream.group(2)) if stream.group(2) else STREAM_PAUSE_MS
        for n, piece in enumerate(_pieces(text, int(stream.group(1)))):
            if n:
                await asyncio.sleep(pause / 1000)
            await emit(piece)
        return []

    async def reply(
        self,
        *,
        input: str,
        mode: History,
        history: Sequence[PastTurn],
        results: Sequence[ToolOutcome] = (),
    ) -> str:
        """The whole reply, as ``step`` streams it."""
        delay = self.delay_ms
        match = _SLEEP.match(input)
        if match:
            delay += int(match.group(1))
        if delay:
            await asyncio.sleep(delay / 1000)
        if input.strip() == "/fail":
            raise ModelError("the fixture model was asked to fail (/fail)")
        lines = [f"fixture reply to: {input}"]
        # The setting, then what it showed: under FULL a first turn has no
        # earlier turns; under NONE the model is shown none by design.
        if history:
            lines.append(
                f"history: {mode}, {len(history)} earlier turn(s), digest {_digest(history)}"
            )
            for n, past in enumerate(history, 1):
                mark = "" if past.status == TurnStatus.COMPLETED else f" [{past.status.lower()}]"
                lines.append(f"  {n}. {past.input}{mark}")
        elif mode is History.FULL:
            lines.append("history: FULL, no earlier turns")
        else:
            lines.append(f"history: {mode}")
        for outcome in results:
            arguments = json.dumps(outcome.arguments, sort_keys=True)
            result = json.dumps(outcome.result, sort_keys=True)
            lines.append(f"tool {outcome.index} {outcome.tool} {arguments}: {result}")
        return "\n".join(lines)

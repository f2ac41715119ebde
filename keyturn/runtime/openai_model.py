"""A model served by any server that speaks OpenAI's chat completions: OpenAI
itself, vLLM, Ollama, llama.cpp's server, LM Studio, LiteLLM.

The official SDK (``openai.AsyncOpenAI``) speaks the protocol: every round is
one streamed chat completion offered the process's tools. Text deltas go to
``emit`` as they arrive; tool-call fragments are put together by their index.
The SDK retries a request that met a 429, a 5xx, a timeout or a lost
connection (``max_retries``) before anything streamed, so a retry never
repeats recorded output; whatever still fails ends the turn FAILED with a
:class:`~keyturn.errors.ModelError` saying what the server did. The API key
goes to the SDK and nowhere else: no message this module writes contains it.

:func:`build_messages` is the conversation a round sends, a pure function of
the turn, its history and its earlier rounds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit, urlunsplit

import openai

from keyturn.domain import History, TurnStatus
from keyturn.errors import ModelError
from keyturn.runtime.model import Emit, PastTurn, Round, ToolRequest, ToolSpec
from keyturn.settings import Settings

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

Message = dict[str, Any]

# The SDK requires a key; servers on one's own machine (Ollama, llama.cpp,
# vLLM without --api-key) accept any. Sent only when none is configured.
NO_KEY = "not-set"
MODEL_REQUIRED = "KEYTURN_OPENAI_MODEL must name the model when KEYTURN_MODEL=openai"
# How much of a server's own error message a turn's error quotes.
_DETAIL_CHARS = 200

INTERRUPTED_NO_OUTPUT = "[This turn was interrupted before it finished; no output was recorded.]"
INTERRUPTED_WITH_OUTPUT = (
    "[This turn was interrupted before it finished; the output recorded before it stopped"
    " follows.]\n"
)
CANCELLED_NO_OUTPUT = "[This turn was cancelled before it finished; no output was recorded.]"
CANCELLED_WITH_OUTPUT = (
    "[This turn was cancelled before it finished; the output recorded before it stopped follows.]\n"
)


# -- what is sent --------------------------------------------------------------
def _arguments_text(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def _result_text(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


def _call(call_id: str, tool: str, arguments: dict[str, Any]) -> Message:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": tool, "arguments": _arguments_text(arguments)},
    }


def past_turn_messages(past: PastTurn, position: int) -> list[Message]:
    """One earlier turn as the conversation shows it: the user's input, the
    calls whose results the record holds with those results, then the
    output. An interrupted or cancelled turn says so in its reply. ``position`` names its
    calls (``turn{position}_call{index}``), unique within one request."""
    messages: list[Message] = [{"role": "user", "content": past.input}]
    if past.tools:
        ids = [f"turn{position}_call{outcome.index}" for outcome in past.tools]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call(i, o.tool, o.arguments) for i, o in zip(ids, past.tools, strict=True)
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": i, "content": _result_text(o.result)}
            for i, o in zip(ids, past.tools, strict=True)
        )
    output = past.output or ""
    if past.status is TurnStatus.INTERRUPTED:
        output = INTERRUPTED_WITH_OUTPUT + output if output else INTERRUPTED_NO_OUTPUT
    elif past.status is TurnStatus.CANCELLED:
        output = CANCELLED_WITH_OUTPUT + output if output else CANCELLED_NO_OUTPUT
    messages.append({"role": "assistant", "content": output})
    return messages


def _size(messages: Sequence[Message]) -> int:
    """Characters a budget counts: contents, tool names and arguments."""
    total = 0
    for message in messages:
        total += len(message.get("content") or "")
        for call in message.get("tool_calls", ()):
            total += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return total


def build_messages(
    *,
    input: str,
    mode: History,
    history: Sequence[PastTurn],
    rounds: Sequence[Round],
    system_prompt: str | None = None,
    max_history_chars: int | None = None,
) -> list[Message]:
    """The conversation for the next round: the system prompt (if any), the
    earlier turns a FULL history shows (the oldest dropped first while they
    exceed ``max_history_chars``), the turn's input, then each earlier round
    of this turn (its text and calls, one ``tool`` message per result)."""
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    if mode is History.FULL:
        turns = [past_turn_messages(past, n) for n, past in enumerate(history, 1)]
        if max_history_chars is not None:
            sizes = [_size(t) for t in turns]
            total = sum(sizes)
            first = 0
            while first < len(turns) and total > max_history_chars:
                total -= sizes[first]
                first += 1
            turns = turns[first:]
        for turn in turns:
            messages.extend(turn)
    messages.append({"role": "user", "content": input})
    for number, round in enumerate(rounds):
        ids = [o.call_id or f"call_{number}_{o.index}" for o in round.outcomes]
        messages.append(
            {
                "role": "assistant",
                "content": round.text or None,
                "tool_calls": [
                    _call(i, o.tool, o.arguments) for i, o in zip(ids, round.outcomes, strict=True)
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": i, "content": _result_text(o.result)}
            for i, o in zip(ids, round.outcomes, strict=True)
        )
    return messages


def tool_params(tools: Sequence[ToolSpec]) -> list[Message]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


# -- what comes back -----------------------------------------------------------
@dataclass
class _CallParts:
    """One tool call as its fragments arrive."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _malformed(what: str) -> ModelError:
    return ModelError(f"the model server sent a malformed stream: {what}")


def _read_chunk(chunk: Any, calls: dict[int, _CallParts]) -> str:
    """The text of one streamed chunk; its tool-call fragments go into
    ``calls``. A chunk that is not shaped as the protocol says fails the turn."""
    choices = getattr(chunk, "choices", None)
    if not isinstance(choices, list):
        raise _malformed("a chunk without a list of choices")
    text: list[str] = []
    for choice in choices:
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        content = getattr(delta, "content", None)
        if content is not None:
            if not isinstance(content, str):
                raise _malformed("a text delta that is not a string")
            text.append(content)
        pieces = getattr(delta, "tool_calls", None) or []
        if not isinstance(pieces, list):
            raise _malformed("tool_calls that are not a list")
        for piece in pieces:
            index = getattr(piece, "index", None)
            if not isinstance(index, int):
                index = len(calls)  # servers that send each call whole, unnumbered
            parts = calls.setdefault(index, _CallParts())
            call_id = getattr(piece, "id", None)
            if isinstance(call_id, str) and call_id:
                parts.id = call_id
            function = getattr(piece, "function", None)
            name = getattr(function, "name", None)
            if isinstance(name, str) and name:
                parts.name = name
            arguments = getattr(function, "arguments", None)
            if arguments is not None:
                if not isinstance(arguments, str):
                    raise _malformed("tool-call arguments that are not a string")
                parts.arguments.append(arguments)
    return "".join(text)


def _requests(calls: dict[int, _CallParts], round_number: int) -> list[ToolRequest]:
    requests = []
    for index in sorted(calls):
        parts = calls[index]
        if not parts.name:
            raise _malformed(f"tool call {index} has no function name")
        text = "".join(parts.arguments).strip() or "{}"
        try:
            arguments = json.loads(text)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            shown = text if len(text) <= 80 else text[:80] + "…"
            raise ModelError(
                f"the model called tool {parts.name!r} with arguments that are not a JSON"
                f" object: {shown}"
            )
        call_id = parts.id or f"call_{round_number}_{index}"
        requests.append(ToolRequest(parts.name, arguments, call_id))
    return requests


# -- failures ------------------------------------------------------------------
def _where(base_url: str) -> str:
    """The server's address without any user or password in it."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _server_detail(error: openai.APIStatusError, secret: str | None) -> str:
    """The server's own message, shortened, with the key (should it be
    echoed) taken out before it is cut, so no part of it is left."""
    body = error.body
    message: object = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
    if not isinstance(message, str) or not message.strip():
        return ""
    message = " ".join(message.split())
    if secret:
        message = message.replace(secret, "[redacted]")
    if len(message) > _DETAIL_CHARS:
        message = message[:_DETAIL_CHARS] + "…"
    return f": {message}"


class _Failures:
    """Turns the SDK's exceptions into ModelErrors that say what happened,
    with the key (should a server echo it) taken out."""

    def __init__(self, *, base_url: str, timeout_s: float, secret: str | None) -> None:
        self.where = _where(base_url)
        self.timeout_s = timeout_s
        self.secret = secret

    def _clean(self, message: str) -> str:
        if self.secret:
            message = message.replace(self.secret, "[redacted]")
        # A server's text is quoted, not relayed whole.
        limit = _DETAIL_CHARS * 2
        return message if len(message) <= limit else message[:limit] + "…"

    def translate(self, error: openai.OpenAIError, *, streaming: bool) -> ModelError:
        if isinstance(error, openai.APITimeoutError):
            message = (
                f"the model server timed out after {self.timeout_s:g} s"
                f"{' while streaming' if streaming else ''} (KEYTURN_OPENAI_TIMEOUT_S)"
            )
        elif isinstance(error, openai.APIStatusError):
            if error.status_code in (401, 403):
                # A refusal's text may quote part of the key: not repeated.
                message = (
                    f"the model server answered {error.status_code}: it refused the API key"
                    " (KEYTURN_OPENAI_API_KEY)"
                )
            else:
                detail = _server_detail(error, self.secret)
                message = f"the model server answered {error.status_code}{detail}"
        elif isinstance(error, openai.APIConnectionError):
            message = (
                f"the connection to the model server at {self.where} was lost while streaming"
                if streaming
                else f"could not reach the model server at {self.where}"
            )
        elif isinstance(error, openai.APIResponseValidationError):
            message = f"the model server sent a malformed answer: {error.message}"
        elif isinstance(error, openai.APIError):
            message = f"the model server reported an error: {error.message}"
        else:
            message = f"the model client failed: {type(error).__name__}"
        return ModelError(self._clean(message))


# -- the model -----------------------------------------------------------------
def _client(settings: Settings, *, max_retries: int | None = None) -> openai.AsyncOpenAI:
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    # Everything is passed explicitly: the SDK would otherwise read OPENAI_*
    # variables itself, and only keyturn.settings reads the environment.
    extra: dict[str, Any] = {} if max_retries is None else {"max_retries": max_retries}
    return openai.AsyncOpenAI(
        api_key=key or NO_KEY,
        base_url=settings.openai_base_url,
        timeout=settings.openai_timeout_s,
        **extra,
    )


def _failures(settings: Settings) -> _Failures:
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return _Failures(
        base_url=settings.openai_base_url, timeout_s=settings.openai_timeout_s, secret=key
    )


class OpenAIModel:
    """The Model seam over chat completions (see the module's docstring)."""

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        failures: _Failures,
        system_prompt: str | None = None,
        max_history_chars: int | None = None,
    ) -> None:
        self.client = client
        self.model = model
        self.failures = failures
        self.system_prompt = system_prompt
        self.max_history_chars = max_history_chars

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIModel:
        if not settings.openai_model:
            raise ModelError(MODEL_REQUIRED)
        return cls(
            client=_client(settings),
            model=settings.openai_model,
            failures=_failures(settings),
            system_prompt=settings.system_prompt,
            max_history_chars=settings.history_max_chars,
        )

    async def close(self) -> None:
        await self.client.close()

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
        messages = build_messages(
            input=input,
            mode=mode,
            history=history,
            rounds=rounds,
            system_prompt=self.system_prompt,
            max_history_chars=self.max_history_chars,
        )
        calls: dict[int, _CallParts] = {}
        streaming = False
        try:
            if tools:
                stream = await self.client.chat.completions.create(
                    model=self.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    tools=cast("list[ChatCompletionToolParam]", tool_params(tools)),
                    stream=True,
                )
            else:
                stream = await self.client.chat.completions.create(
                    model=self.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    stream=True,
                )
            streaming = True
            async with stream:
                async for chunk in _chunks(stream):
                    text = _read_chunk(chunk, calls)
                    if text:
                        await emit(text)
        except openai.OpenAIError as error:
            raise self.failures.translate(error, streaming=streaming) from None
        return _requests(calls, len(rounds))


async def _chunks(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The stream's chunks; a data line that is not JSON (the SDK's
    ``json.loads`` raises while iterating) fails the turn as malformed."""
    iterator = stream.__aiter__()
    while True:
        try:
            chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except ValueError as error:
            raise _malformed(f"a data line that is not JSON ({error})") from None
        yield chunk


async def list_models(settings: Settings) -> list[str]:
    """The ids of the models the configured server lists (GET /models),
    without sending a completion; a ModelError saying why not."""
    client = _client(settings, max_retries=0)
    try:
        return [model.id async for model in client.models.list()]
    except openai.OpenAIError as error:
        raise _failures(settings).translate(error, streaming=False) from None
    finally:
        await client.close()


def server_address(settings: Settings) -> str:
    """Where the model server is, as a line may show it (no credentials)."""
    return _where(settings.openai_base_url)

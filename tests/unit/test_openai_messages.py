"""The conversation the OpenAI adapter sends: history, rounds, tool messages,
the character budget; and what it makes of streamed tool-call fragments."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from keyturn.domain import History, TurnStatus
from keyturn.errors import ModelError
from keyturn.runtime.model import PastTurn, Round, ToolOutcome, ToolSpec
from keyturn.runtime.openai_model import (
    INTERRUPTED_NO_OUTPUT,
    _CallParts,
    _read_chunk,
    _requests,
    _where,
    build_messages,
    tool_params,
)

WRITE = ToolOutcome(0, "synthetic_write", {"name": "a", "value": "1"}, {"applied": True}, "c0")


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def test_a_first_turn_is_the_system_prompt_then_the_input() -> None:
    messages = build_messages(
        input="hello", mode=History.FULL, history=[], rounds=[], system_prompt="Be brief."
    )
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert build_messages(input="hello", mode=History.FULL, history=[], rounds=[]) == [
        {"role": "user", "content": "hello"}
    ]


def test_full_history_is_pairs_with_known_tool_results_and_interruptions_marked() -> None:
    history = [
        PastTurn("set a", "done", TurnStatus.COMPLETED, (WRITE,)),
        PastTurn("long job", "half of it", TurnStatus.INTERRUPTED),
        PastTurn("another", None, TurnStatus.INTERRUPTED),
    ]
    messages = build_messages(input="now?", mode=History.FULL, history=history, rounds=[])
    assert roles(messages) == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    call = messages[1]["tool_calls"][0]
    assert call["function"] == {
        "name": "synthetic_write",
        "arguments": json.dumps({"name": "a", "value": "1"}, sort_keys=True),
    }
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": json.dumps({"applied": True}),
    }
    assert messages[3] == {"role": "assistant", "content": "done"}
    assert "interrupted" in messages[5]["content"]
    assert messages[5]["content"].endswith("\nhalf of it")
    assert messages[7]["content"] == INTERRUPTED_NO_OUTPUT
    assert messages[-1] == {"role": "user", "content": "now?"}


def test_none_sends_only_the_turns_own_input() -> None:
    history = [PastTurn("earlier", "reply", TurnStatus.COMPLETED)]
    assert build_messages(input="alone", mode=History.NONE, history=history, rounds=[]) == [
        {"role": "user", "content": "alone"}
    ]


def test_each_round_is_an_assistant_message_with_its_calls_then_one_tool_message_each() -> None:
    read = ToolOutcome(1, "synthetic_read", {"name": "a"}, {"value": "1"}, "c1")
    rounds = [Round("Let me look. ", (WRITE, read)), Round("", (WRITE,))]
    messages = build_messages(input="go", mode=History.NONE, history=[], rounds=rounds)
    assert roles(messages) == ["user", "assistant", "tool", "tool", "assistant", "tool"]
    assert messages[1]["content"] == "Let me look. "
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c0", "c1"]
    assert [m["tool_call_id"] for m in messages[2:4]] == ["c0", "c1"]
    assert json.loads(messages[3]["content"]) == {"value": "1"}
    assert messages[4]["content"] is None


def test_the_character_budget_drops_the_oldest_turns_first() -> None:
    history = [PastTurn(f"input {n}", "x" * 100, TurnStatus.COMPLETED) for n in range(5)]
    every = build_messages(input="q", mode=History.FULL, history=history, rounds=[])
    assert len(every) == 11
    kept = build_messages(
        input="q", mode=History.FULL, history=history, rounds=[], max_history_chars=250
    )
    assert [m["content"] for m in kept if m["role"] == "user"] == ["input 3", "input 4", "q"]
    # The turn's own input is never dropped, however small the budget.
    assert build_messages(
        input="q", mode=History.FULL, history=history, rounds=[], max_history_chars=1
    ) == [{"role": "user", "content": "q"}]


def test_tools_are_offered_as_functions_with_their_schema() -> None:
    spec = ToolSpec("synthetic_read", "Read NAME.", {"type": "object", "properties": {}})
    assert tool_params([spec]) == [
        {
            "type": "function",
            "function": {
                "name": "synthetic_read",
                "description": "Read NAME.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]


def _piece(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> Any:
    return SimpleNamespace(index=index, id=id, function=SimpleNamespace(name=name, arguments=args))


def _chunk(*, content: str | None = None, calls: list[Any] | None = None) -> Any:
    return SimpleNamespace(
        choices=[SimpleNamespace(delta=SimpleNamespace(content=content, tool_calls=calls))]
    )


def test_fragments_are_put_together_by_index() -> None:
    calls: dict[int, _CallParts] = {}
    assert _read_chunk(_chunk(content="Hi"), calls) == "Hi"
    _read_chunk(_chunk(calls=[_piece(0, id="a", name="synthetic_write", args='{"na')]), calls)
    _read_chunk(_chunk(calls=[_piece(1, id="b", name="synthetic_read", args="")]), calls)
    _read_chunk(_chunk(calls=[_piece(0, args='me": "x", "value": "1"}')]), calls)
    _read_chunk(_chunk(calls=[_piece(1, args='{"name": "x"}')]), calls)
    requests = _requests(calls, 0)
    assert [(r.tool, r.arguments, r.call_id) for r in requests] == [
        ("synthetic_write", {"name": "x", "value": "1"}, "a"),
        ("synthetic_read", {"name": "x"}, "b"),
    ]


@pytest.mark.parametrize("arguments", ["{name: x", "[1, 2]", '"text"'])
def test_arguments_that_are_not_a_json_object_name_the_tool(arguments: str) -> None:
    calls: dict[int, _CallParts] = {}
    _read_chunk(_chunk(calls=[_piece(0, id="a", name="synthetic_write", args=arguments)]), calls)
    with pytest.raises(ModelError, match=r"tool 'synthetic_write'.*not a JSON object"):
        _requests(calls, 0)


def test_a_chunk_without_choices_is_malformed() -> None:
    with pytest.raises(ModelError, match="malformed stream"):
        _read_chunk(SimpleNamespace(choices="nope"), {})


def test_the_server_address_shown_has_no_credentials() -> None:
    assert _where("http://user:secret@models.internal:8080/v1") == "http://models.internal:8080/v1"


def test_a_key_the_server_echoes_is_taken_out_before_its_message_is_cut() -> None:
    import httpx2
    import openai

    from keyturn.runtime.openai_model import _Failures

    key = "sk-unit-0123456789abcdef"
    request = httpx2.Request("POST", "http://models.internal/v1/chat/completions")
    # Cut at 200 characters first, the key would be left in part.
    message = "x" * 180 + f" key {key} is over its quota"
    error = openai.InternalServerError(
        message,
        response=httpx2.Response(500, request=request),
        body={"error": {"message": message}},
    )
    failures = _Failures(base_url="http://models.internal/v1", timeout_s=1, secret=key)
    text = str(failures.translate(error, streaming=False))
    assert text.startswith("the model server answered 500: xxx")
    assert key[:8] not in text and "[redacted]" in text

"""Keyturn with KEYTURN_MODEL=openai against an OpenAI-compatible server of the
tests' own (tests/support/openai_server.py), everything driven through the API:
streamed text, tool rounds through the ledger, the history a model is sent,
failures of the server, replays, doctor, and the API key kept out of sight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.errors import ModelError
from keyturn.runtime.openai_model import MODEL_REQUIRED
from keyturn.runtime.process import build_model
from keyturn.settings import Settings
from tests.support import GraphQLClient, InProcessServer, fast_settings, serve_in_process
from tests.support.openai_server import Call, ModelServer, Reply, serve_model, text
from tests.support.tool_servers import stdio_entry, write_tools_file

# Recognisable, so that any output it reached can be found.
FAKE_KEY = "sk-keyturn-fake-7f3c9a1e5b2d"
ENDED = {"COMPLETED", "FAILED", "INTERRUPTED"}

TURN = """
query($id: ID!) { turn(id: $id) {
  id status output error
  toolCalls { index tool arguments state result }
  events { seq type data }
} }
"""


def openai_settings(model_server: ModelServer, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "model": "openai",
        "openai_base_url": model_server.base_url,
        "openai_api_key": FAKE_KEY,
        "openai_model": "test-model",
        "openai_timeout_s": 5.0,
    }
    values.update(overrides)
    return fast_settings(**values)


@pytest.fixture
async def model_server() -> AsyncIterator[ModelServer]:
    async with serve_model() as srv:
        yield srv


class Keyturn:
    """A Keyturn server on the scripted model, and a client for it."""

    def __init__(self, server: InProcessServer, client: GraphQLClient) -> None:
        self.server = server
        self.client = client

    async def run(
        self, session: str, key: str, input: str, history: str | None = None
    ) -> dict[str, Any]:
        """Submit a turn and wait for its end; the turn with its events."""
        admitted = await self.client.submit(session, key, input, history)
        turn_id = admitted["turn"]["id"]
        await self.client.wait_for_status(turn_id, ENDED)
        return await self.turn(turn_id)

    async def turn(self, turn_id: str) -> dict[str, Any]:
        data = await self.client.execute(TURN, {"id": turn_id})
        result: dict[str, Any] = data["turn"]
        return result


@contextlib.asynccontextmanager
async def keyturn(database_url: str, settings: Settings) -> AsyncIterator[Keyturn]:
    async with serve_in_process(database_url, settings) as server:
        client = GraphQLClient(server.url)
        try:
            yield Keyturn(server, client)
        finally:
            await client.close()


def types(turn: dict[str, Any]) -> list[str]:
    return [e["type"] for e in turn["events"]]


def failed_error(turn: dict[str, Any]) -> str:
    assert turn["status"] == "FAILED", turn
    [event] = [e for e in turn["events"] if e["type"] == "turn.failed"]
    assert event["data"]["error"] == turn["error"]
    error: str = turn["error"]
    return error


# -- replies and tools ---------------------------------------------------------
async def test_streamed_text_is_the_output_and_the_request_offers_the_tools(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.script(text("Hel", "lo, ", "world"))
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "say hello")
    assert t["status"] == "COMPLETED" and t["output"] == "Hello, world"
    deltas = [e["data"]["text"] for e in t["events"] if e["type"] == "turn.delta"]
    # Recorded as they stream: together they are the output, byte for byte.
    assert deltas and "".join(deltas) == t["output"]
    [request] = model_server.requests
    assert request["model"] == "test-model" and request["stream"] is True
    assert request["messages"] == [{"role": "user", "content": "say hello"}]
    offered = {tool["function"]["name"] for tool in request["tools"]}
    assert {"synthetic_write", "synthetic_read", "synthetic_append"} <= offered


async def test_the_system_prompt_comes_first(database_url: str, model_server: ModelServer) -> None:
    settings = openai_settings(model_server, system_prompt="You answer in French.")
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hello")
    assert t["output"] == "echo: hello"
    assert model_server.requests[0]["messages"] == [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "hello"},
    ]


async def test_one_tool_round_goes_through_the_ledger_and_back_as_a_tool_message(
    database_url: str, model_server: ModelServer, db: Any
) -> None:
    model_server.script(
        Reply(
            text=("Writing. ",),
            calls=[Call("call_w1", "synthetic_write", '{"name": "colour", "value": "blue"}')],
        ),
        text("Done: colour is blue."),
    )
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "set colour to blue")
    assert t["status"] == "COMPLETED"
    assert t["output"] == "Writing. Done: colour is blue."
    ledger = [x for x in types(t) if x.startswith("tool.")]
    assert ledger == ["tool.planned", "tool.intent", "tool.result"]
    [call] = t["toolCalls"]
    assert (call["tool"], call["arguments"], call["state"]) == (
        "synthetic_write",
        {"name": "colour", "value": "blue"},
        "COMPLETED",
    )
    applied = await db.fetchval(
        "SELECT count(*) FROM synthetic_effects WHERE effect_key = $1 AND applied",
        f"{t['id']}/0",
    )
    assert applied == 1
    first, second = model_server.requests
    assert (
        second["messages"][0]
        == first["messages"][0]
        == {
            "role": "user",
            "content": "set colour to blue",
        }
    )
    assistant, tool_message = second["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Writing. "
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_w1"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "name": "colour",
        "value": "blue",
    }
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_w1"
    assert json.loads(tool_message["content"]) == call["result"]


async def test_several_rounds_each_send_back_every_result_with_its_id(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.script(
        Reply(calls=[Call("w", "synthetic_write", '{"name": "n", "value": "1"}')]),
        Reply(
            calls=[
                Call("r", "synthetic_read", '{"name": "n"}'),
                Call("a", "synthetic_append", '{"name": "log", "value": "x"}'),
            ]
        ),
        text("all done"),
    )
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "work")
    assert t["status"] == "COMPLETED" and t["output"] == "all done"
    assert [(c["index"], c["tool"], c["state"]) for c in t["toolCalls"]] == [
        (0, "synthetic_write", "COMPLETED"),
        (1, "synthetic_read", "COMPLETED"),
        (2, "synthetic_append", "COMPLETED"),
    ]
    assert types(t).count("tool.planned") == 2
    assert len(model_server.requests) == 3
    last = model_server.requests[2]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    assert [m.get("tool_call_id") for m in last if m["role"] == "tool"] == ["w", "r", "a"]
    results = {c["tool"]: c["result"] for c in t["toolCalls"]}
    assert json.loads(last[4]["content"]) == results["synthetic_read"]
    assert json.loads(last[4]["content"])["value"] == "1"  # it read what round one wrote


async def test_a_model_that_never_stops_calling_tools_fails_after_the_round_limit(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.respond = lambda _body: Reply(calls=[Call("r", "synthetic_read", '{"name": "n"}')])
    settings = openai_settings(model_server, max_tool_rounds=2)
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "loop")
    assert "still asking for tools after 2 rounds" in failed_error(t)
    assert "KEYTURN_MAX_TOOL_ROUNDS" in t["error"]
    assert len(model_server.requests) == 3


async def test_tool_arguments_that_are_not_json_fail_the_turn_naming_the_tool(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.script(Reply(calls=[Call("c", "synthetic_write", '{name: "x", value')]))
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "write badly")
    error = failed_error(t)
    assert "'synthetic_write'" in error and "not a JSON object" in error
    assert not [x for x in types(t) if x.startswith("tool.")]  # nothing was run


@pytest.mark.parametrize(
    ("tool", "arguments", "settings", "state", "error"),
    [
        # The tool answered isError.
        ("files__fail", {"reason": "not today"}, {}, "COMPLETED", "refused: not today"),
        # The tool did not answer in time: the model is told its effect is unknown.
        (
            "files__hang",
            {"seconds": 30},
            {"tool_timeout_s": 1.0},
            "OUTCOME_UNKNOWN",
            "files__hang did not answer within 1s (KEYTURN_TOOL_TIMEOUT_S);"
            " whether it acted is unknown",
        ),
    ],
    ids=["isError", "timeout"],
)
async def test_a_tool_error_is_sent_back_as_the_tool_message_and_the_next_reply_completes(
    database_url: str,
    model_server: ModelServer,
    tmp_path: Path,
    tool: str,
    arguments: dict[str, Any],
    settings: dict[str, Any],
    state: str,
    error: str,
) -> None:
    tools_file = write_tools_file(tmp_path / "tools.toml", stdio_entry(tmp_path / "effects.jsonl"))
    model_server.script(
        Reply(text=("Trying. ",), calls=[Call("call_f1", tool, json.dumps(arguments))]),
        text("That did not work."),
    )
    configured = openai_settings(model_server, tools_file=tools_file, **settings)
    async with keyturn(database_url, configured) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "try the tool")
    assert t["status"] == "COMPLETED"
    assert t["output"] == "Trying. That did not work."
    [call] = t["toolCalls"]
    assert (call["tool"], call["state"]) == (tool, state)
    assert error in call["result"]["error"]
    _first, second = model_server.requests
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_f1"
    assert json.loads(tool_message["content"]) == call["result"]


# -- history -------------------------------------------------------------------
async def take_over(db: Any, turn_id: str) -> None:
    """Another owner took the turn: its renewal is refused and its lease is
    past, so a sweep interrupts it."""
    await db.execute(
        "UPDATE turns SET epoch = epoch + 1, lease_until = now() - interval '1 second' "
        "WHERE id = $1::uuid",
        turn_id,
    )


async def test_full_history_sends_earlier_turns_with_their_tool_results_and_marks_interruptions(
    database_url: str, model_server: ModelServer, db: Any
) -> None:
    model_server.script(
        Reply(calls=[Call("w", "synthetic_write", '{"name": "a", "value": "1"}')]),
        text("a is set"),
        Reply(calls=[Call("r", "synthetic_read", '{"name": "a"}')]),
        # The second round of the second turn hangs until the turn is taken over.
        Reply(stall_s=30),
        text("third reply"),
        text("alone"),
    )
    async with keyturn(database_url, openai_settings(model_server, openai_timeout_s=60)) as kt:
        sid = await kt.client.create_session()
        first = await kt.run(sid, "k1", "set a")
        admitted = await kt.client.submit(sid, "k2", "read a")
        second_id = admitted["turn"]["id"]
        deadline = time.monotonic() + 20
        while len(model_server.requests) < 4:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await take_over(db, second_id)
        await kt.client.wait_for_status(second_id, {"INTERRUPTED"})
        third = await kt.run(sid, "k3", "what happened?")
        alone = await kt.run(sid, "k4", "just this", history="NONE")
    assert first["output"] == "a is set" and third["output"] == "third reply"
    messages = model_server.requests[4]["messages"]
    assert [m["role"] for m in messages] == [
        "user", "assistant", "tool", "assistant",  # set a: its write, its reply
        "user", "assistant", "tool", "assistant",  # read a: its read, interrupted
        "user",
    ]  # fmt: skip
    assert messages[0]["content"] == "set a" and messages[3]["content"] == "a is set"
    assert messages[1]["tool_calls"][0]["function"]["name"] == "synthetic_write"
    assert json.loads(messages[2]["content"]) == first["toolCalls"][0]["result"]
    assert messages[4]["content"] == "read a"
    assert messages[5]["tool_calls"][0]["function"]["name"] == "synthetic_read"
    assert json.loads(messages[6]["content"])["value"] == "1"
    assert "interrupted" in messages[7]["content"]
    assert messages[8] == {"role": "user", "content": "what happened?"}
    assert model_server.requests[5]["messages"] == [{"role": "user", "content": "just this"}]
    assert alone["output"] == "alone"


async def test_full_history_reads_only_the_latest_turns(
    database_url: str, model_server: ModelServer
) -> None:
    settings = openai_settings(model_server, history_max_turns=2)
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        for n in range(4):
            await kt.run(sid, f"k{n}", f"turn {n}")
    last = model_server.requests[3]["messages"]
    assert [m["content"] for m in last] == [
        "turn 1",
        "echo: turn 1",
        "turn 2",
        "echo: turn 2",
        "turn 3",
    ]


async def test_the_character_budget_drops_the_oldest_turns(
    database_url: str, model_server: ModelServer
) -> None:
    settings = openai_settings(model_server, history_max_chars=40)
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        for n in range(4):
            await kt.run(sid, f"k{n}", f"turn {n} " + "x" * 5)
    # Each earlier turn counts 2 * 12 + 6 = 30 characters: only one fits.
    last = model_server.requests[3]["messages"]
    assert [m["content"] for m in last] == ["turn 2 xxxxx", "echo: turn 2 xxxxx", "turn 3 xxxxx"]


async def test_a_same_key_retry_never_calls_the_model_again(
    database_url: str, model_server: ModelServer
) -> None:
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "once")
        assert model_server.completions == 1
        again = await kt.client.submit(sid, "k1", "once")
        assert again["__typename"] == "TurnReplayed"
        assert again["turn"]["id"] == t["id"] and again["turn"]["output"] == "echo: once"
        # Long enough for a worker to have claimed anything it was going to.
        await asyncio.sleep(0.5)
    assert model_server.completions == 1


# -- the server failing --------------------------------------------------------
async def test_a_429_is_retried_by_the_sdk_and_the_turn_completes(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.script(Reply(status=429, error="slow down"), text("after the wait"))
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert t["status"] == "COMPLETED" and t["output"] == "after the wait"
    assert len(model_server.requests) == 2


async def test_a_server_that_keeps_answering_500_fails_the_turn_after_the_retries(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.respond = lambda _body: Reply(status=500, error="the GPU caught fire")
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert failed_error(t) == "the model server answered 500: the GPU caught fire"
    assert t["output"] is None
    assert len(model_server.requests) == 3  # the first try and the SDK's two retries


async def test_a_server_that_keeps_answering_429_fails_the_turn_after_the_retries(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.respond = lambda _body: Reply(status=429, error="rate limit reached")
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert failed_error(t) == "the model server answered 429: rate limit reached"
    # The first try and the SDK's two retries (its default, which the adapter keeps).
    assert len(model_server.requests) == 3
    assert t["output"] is None
    assert "turn.delta" not in types(t)


async def test_a_server_that_does_not_answer_in_time_fails_the_turn(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.respond = lambda _body: Reply(stall_s=30)
    settings = openai_settings(model_server, openai_timeout_s=0.3)
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert failed_error(t) == ("the model server timed out after 0.3 s (KEYTURN_OPENAI_TIMEOUT_S)")
    assert len(model_server.requests) == 3


async def test_a_stream_that_stalls_fails_without_a_retry(
    database_url: str, model_server: ModelServer
) -> None:
    model_server.respond = lambda _body: Reply(text=("never",), stall_after_first_s=30)
    settings = openai_settings(model_server, openai_timeout_s=0.3)
    async with keyturn(database_url, settings) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert failed_error(t) == (
        "the model server timed out after 0.3 s while streaming (KEYTURN_OPENAI_TIMEOUT_S)"
    )
    # Once streaming began the request is not sent again.
    assert len(model_server.requests) == 1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["{not json"], "the model server sent a malformed stream: a data line that is not JSON"),
        (
            ['{"id": "x", "object": "chat.completion.chunk", "choices": "nope"}', "[DONE]"],
            "the model server sent a malformed stream: a chunk without a list of choices",
        ),
    ],
)
async def test_a_malformed_stream_fails_the_turn(
    database_url: str, model_server: ModelServer, raw: list[str], expected: str
) -> None:
    model_server.script(Reply(raw=raw))
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        t = await kt.run(sid, "k1", "hi")
    assert failed_error(t).startswith(expected)


# -- the key, doctor, the start ------------------------------------------------
async def test_the_api_key_reaches_the_server_and_no_output_of_keyturn(
    database_url: str, model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    model_server.script(
        text("fine"),
        Reply(status=401, error=f"Incorrect API key provided: {FAKE_KEY}"),
    )
    model_server.respond = lambda _body: Reply(status=500, error=f"no quota for key {FAKE_KEY}")
    async with keyturn(database_url, openai_settings(model_server)) as kt:
        sid = await kt.client.create_session()
        ok = await kt.run(sid, "k1", "hi")
        refused = await kt.run(sid, "k2", "again")
        broken = await kt.run(sid, "k3", "once more")
        session = await kt.client.session(sid)
    assert ok["status"] == "COMPLETED"
    assert "refused the API key" in failed_error(refused)
    assert failed_error(broken) == "the model server answered 500: no quota for key [redacted]"
    assert {h["authorization"] for h in model_server.headers} == {f"Bearer {FAKE_KEY}"}
    assert repr(openai_settings(model_server)).count(FAKE_KEY) == 0
    doctor = await run_doctor(database_url, doctor_env(model_server))
    outputs = {
        "logs": caplog.text,
        "turns": json.dumps([ok, refused, broken]),
        "events": json.dumps(session),
        "doctor": doctor,
    }
    for name, output in outputs.items():
        assert FAKE_KEY not in output, name
        assert FAKE_KEY[6:] not in output, name


async def test_the_api_key_falls_back_to_openai_api_key(
    database_url: str,
    model_server: ModelServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    fallback = "sk-openai-fallback-4d8e2b6a9c1f"
    # Set as a user would: only the variable other OpenAI clients read.
    monkeypatch.delenv("KEYTURN_OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", fallback)
    monkeypatch.setenv("KEYTURN_MODEL", "openai")
    monkeypatch.setenv("KEYTURN_OPENAI_BASE_URL", model_server.base_url)
    monkeypatch.setenv("KEYTURN_OPENAI_MODEL", "test-model")
    model_server.script(text("fine"))
    model_server.respond = lambda _body: Reply(status=500, error=f"no quota for key {fallback}")
    async with keyturn(database_url, fast_settings()) as kt:
        sid = await kt.client.create_session()
        ok = await kt.run(sid, "k1", "hi")
        broken = await kt.run(sid, "k2", "again")
        session = await kt.client.session(sid)
    assert ok["status"] == "COMPLETED" and ok["output"] == "fine"
    assert failed_error(broken) == "the model server answered 500: no quota for key [redacted]"
    assert {h["authorization"] for h in model_server.headers} == {f"Bearer {fallback}"}
    outputs = {
        "logs": caplog.text,
        "turns": json.dumps([ok, broken]),
        "events": json.dumps(session),
    }
    for name, output in outputs.items():
        assert fallback not in output, name
        assert fallback[10:] not in output, name


def doctor_env(model_server: ModelServer, model: str = "test-model") -> dict[str, str]:
    return {
        "KEYTURN_MODEL": "openai",
        "KEYTURN_OPENAI_BASE_URL": model_server.base_url,
        "KEYTURN_OPENAI_API_KEY": FAKE_KEY,
        "KEYTURN_OPENAI_MODEL": model,
    }


async def run_doctor(database_url: str, env: dict[str, str]) -> str:
    """`keyturn doctor` as a process; its stdout and stderr together."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KEYTURN_", "OPENAI_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keyturn",
        "doctor",
        env={**base, "KEYTURN_DATABASE_URL": database_url, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode()


def model_line(doctor: str) -> str:
    [line] = [line for line in doctor.splitlines() if line[6:].startswith("model:")]
    return line


async def test_doctor_lists_the_servers_models_without_a_completion(
    database_url: str, model_server: ModelServer
) -> None:
    listed = model_line(await run_doctor(database_url, doctor_env(model_server)))
    assert listed.startswith("ok")
    assert "test-model is among its 1 model(s)" in listed
    missing = model_line(await run_doctor(database_url, doctor_env(model_server, "other")))
    assert missing.startswith("warn") and "other is not among its models (test-model)" in missing
    assert model_server.model_listings == 2 and model_server.completions == 0
    fixture = model_line(await run_doctor(database_url, {}))
    assert fixture.startswith("ok") and "the offline fixture" in fixture


async def test_doctor_says_when_the_model_server_does_not_answer(database_url: str) -> None:
    from keyturn.ops.serverproc import free_port

    env = {
        "KEYTURN_MODEL": "openai",
        "KEYTURN_OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "KEYTURN_OPENAI_MODEL": "m",
    }
    line = model_line(await run_doctor(database_url, env))
    assert line.startswith("fail") and "could not reach the model server" in line


async def test_openai_without_a_model_name_is_a_one_line_start_error() -> None:
    with pytest.raises(ModelError, match="KEYTURN_OPENAI_MODEL must name the model"):
        build_model(Settings(model="openai"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KEYTURN_", "OPENAI_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keyturn",
        "serve",
        env={**base, "KEYTURN_MODEL": "openai"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().strip() == f"keyturn: settings: {MODEL_REQUIRED}"

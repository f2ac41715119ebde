"""The schema in process, without a database: what a client is told when
something fails, which answers are union members rather than errors, and the
limits that refuse a document before any resolver runs.

The runtime is a stand-in with only what the resolvers touch; it records every
call, so a test can show that a refused request never reached it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import strawberry
from graphql import Lexer, Source, TokenKind
from strawberry.types import ExecutionResult

from keyturn.db.records import EventRecord, SessionRecord, TurnRecord
from keyturn.domain import History, Multitask, TurnStatus
from keyturn.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    ShuttingDown,
)
from keyturn.resolvers.context import Context
from keyturn.runtime.admission import Admission, AdmissionOutcome
from keyturn.runtime.resolution import ResolutionOutcome, ResolutionResult
from keyturn.schema import MAX_ALIASES, MAX_DEPTH, MAX_TOKENS, build_schema, schema

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SESSION = SessionRecord(
    id=uuid.UUID("00000000-0000-4000-8000-000000000001"),
    tenant="",
    created_at=NOW,
    default_history=History.FULL,
    event_seq=1,
)
TURN = TurnRecord(
    id=uuid.UUID("00000000-0000-4000-8000-000000000002"),
    session_id=SESSION.id,
    idempotency_key="key-1",
    fingerprint="f",
    input="hello",
    history=History.FULL,
    status=TurnStatus.QUEUED,
    output=None,
    error=None,
    admit_seq=1,
    created_at=NOW,
    started_at=None,
    completed_at=None,
    owner=None,
    lease_until=None,
    epoch=0,
    retry_of=None,
)
EVENT = EventRecord(
    id=1,
    session_id=SESSION.id,
    turn_id=TURN.id,
    seq=1,
    type="turn.started",
    data={"input": "hello"},
    created_at=NOW,
)


class StandInReads:
    def __init__(self, runtime: StandInRuntime) -> None:
        self._runtime = runtime

    async def session(self, session_id: uuid.UUID, *, tenant: str) -> SessionRecord | None:
        self._runtime.called("reads.session")
        return SESSION if session_id == SESSION.id else None

    async def sessions(
        self, *, tenant: str, after: Any, limit: int, count: bool = True
    ) -> tuple[list[SessionRecord], int]:
        self._runtime.called("reads.sessions")
        return [SESSION][:limit], 1 if count else 0

    async def turn(self, turn_id: uuid.UUID, *, tenant: str) -> TurnRecord | None:
        self._runtime.called("reads.turn")
        return TURN if turn_id == TURN.id else None

    async def turns(
        self, *, session_id: uuid.UUID, after: int, limit: int
    ) -> tuple[list[TurnRecord], int]:
        self._runtime.called("reads.turns")
        return [TURN][:limit], 1

    async def turns_batch(
        self, *, session_ids: Sequence[uuid.UUID], after: int, limit: int
    ) -> dict[uuid.UUID, tuple[list[TurnRecord], int]]:
        self._runtime.called("reads.turns_batch")
        return {sid: ([TURN][:limit], 1) for sid in session_ids}

    async def tool_events_of_turns(
        self, turn_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[EventRecord]]:
        self._runtime.called("reads.tool_events_of_turns")
        return {tid: [EVENT] for tid in turn_ids}

    async def turn_event_pages(
        self, turn_ids: Sequence[uuid.UUID], *, after: int, limit: int
    ) -> dict[uuid.UUID, list[EventRecord]]:
        self._runtime.called("reads.turn_event_pages")
        return {tid: [EVENT][:limit] for tid in turn_ids}

    async def events(self, *, session_id: uuid.UUID, after: int, limit: int) -> list[EventRecord]:
        self._runtime.called("reads.events")
        return [EVENT][:limit]


class StandInRuntime:
    """The runtime as far as the resolvers see it. Every call is recorded by
    name; with ``fail`` set, every call raises it."""

    def __init__(self, *, fail: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.reads = StandInReads(self)

    def called(self, name: str) -> None:
        self.calls.append(name)
        if self.fail is not None:
            raise self.fail

    async def create_session(
        self, *, tenant: str, default_history: History, multitask: Multitask
    ) -> SessionRecord:
        self.called("create_session")
        return SESSION

    async def submit(self, request: Any, *, tenant: str) -> Admission:
        self.called("submit")
        return Admission(AdmissionOutcome.ACCEPTED, TURN)

    async def resolve_interrupted(self, request: Any, *, tenant: str) -> ResolutionResult:
        self.called("resolve_interrupted")
        return ResolutionResult(ResolutionOutcome.TURN_NOT_FOUND)

    def session_events(
        self, session_id: uuid.UUID, after_seq: int, *, tenant: str
    ) -> AsyncIterator[EventRecord]:
        async def stream() -> AsyncIterator[EventRecord]:
            self.called("session_events")
            yield EVENT

        return stream()

    def turn_completed(self, turn_id: uuid.UUID, *, tenant: str) -> AsyncIterator[TurnRecord]:
        async def stream() -> AsyncIterator[TurnRecord]:
            self.called("turn_completed")
            yield TURN

        return stream()


def client_view(result: ExecutionResult) -> dict[str, Any]:
    """The response body as GraphQL over HTTP would carry it."""
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        body["errors"] = [error.formatted for error in result.errors]
    return body


async def answer(
    document: str,
    variables: dict[str, Any] | None = None,
    *,
    runtime: StandInRuntime,
    on: strawberry.Schema = schema,
    operation_name: str | None = None,
) -> dict[str, Any]:
    result = await on.execute(
        document,
        variable_values=variables,
        context_value=Context(runtime=cast(Any, runtime)),
        operation_name=operation_name,
    )
    return client_view(result)


async def first_message(
    document: str, variables: dict[str, Any], *, runtime: StandInRuntime
) -> dict[str, Any]:
    """The first message a subscription sends."""
    stream: Any = await schema.subscribe(
        document, variable_values=variables, context_value=Context(runtime=cast(Any, runtime))
    )
    assert isinstance(stream, AsyncGenerator), stream
    try:
        async for result in stream:
            return client_view(result)
    finally:
        await stream.aclose()
    raise AssertionError("the subscription sent nothing")


def messages(body: dict[str, Any]) -> list[str]:
    return [error["message"] for error in body.get("errors", [])]


SESSION_QUERY = "query($id: ID!) { session(id: $id) { id eventCount } }"
CREATE_SESSION = "mutation { createSession { id } }"
SESSION_EVENTS = "subscription($s: ID!) { sessionEvents(sessionId: $s) { seq type } }"
SUBMIT = """
mutation($input: SubmitTurnInput!) {
  submitTurn(input: $input) {
    __typename
    ... on TurnAdmission { replayed turn { id status } }
    ... on InvalidInput { code message field }
  }
}
"""
RESOLVE = """
mutation($input: ResolveInterruptedTurnInput!) {
  resolveInterruptedTurn(input: $input) {
    __typename
    ... on InvalidInput { code message field }
    ... on TurnNotFound { turnId }
  }
}
"""


def submission(**overrides: Any) -> dict[str, Any]:
    values = {"sessionId": str(SESSION.id), "idempotencyKey": "key-1", "input": "hello"}
    values.update(overrides)
    return {"input": values}


# -- (a) what a client is told when something fails ------------------------------

SECRET = 'relation "secret_table" does not exist'


async def test_an_unexpected_error_answers_unexpected_error_and_none_of_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = StandInRuntime(fail=RuntimeError(SECRET))
    with caplog.at_level(logging.ERROR):
        body = await answer(SESSION_QUERY, {"id": str(SESSION.id)}, runtime=runtime)

    assert body["data"] == {"session": None}
    assert [(e["message"], e["path"], e.get("extensions")) for e in body["errors"]] == [
        ("Unexpected error.", ["session"], None)
    ]
    assert "secret_table" not in json.dumps(body)
    # The operator still has it: logged with its traceback.
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1
    assert "secret_table" in logged[0].getMessage()
    assert logged[0].exc_info is not None


async def test_an_unexpected_error_in_a_mutation_is_masked_too() -> None:
    runtime = StandInRuntime(fail=RuntimeError(SECRET))
    body = await answer(CREATE_SESSION, runtime=runtime)

    assert body["data"] is None  # createSession is non-null
    assert messages(body) == ["Unexpected error."]
    assert "secret_table" not in json.dumps(body)
    assert runtime.calls == ["create_session"]


async def test_an_unexpected_error_in_a_subscription_is_masked_too() -> None:
    runtime = StandInRuntime(fail=RuntimeError(SECRET))
    body = await first_message(SESSION_EVENTS, {"s": str(SESSION.id)}, runtime=runtime)

    assert messages(body) == ["Unexpected error."]
    assert "secret_table" not in json.dumps(body)
    assert runtime.calls == ["session_events"]


async def test_database_unavailable_answers_unavailable_and_retryable() -> None:
    runtime = StandInRuntime(fail=DatabaseUnavailable())
    body = await answer(SESSION_QUERY, {"id": str(SESSION.id)}, runtime=runtime)

    assert body["data"] == {"session": None}
    [error] = body["errors"]
    assert error["message"] == "The database did not answer; the request may be retried."
    assert error["extensions"] == {"code": "UNAVAILABLE", "retryable": True}
    assert error["path"] == ["session"]


async def test_an_outcome_unknown_submission_answers_as_unavailable_and_retryable() -> None:
    runtime = StandInRuntime(fail=OutcomeUnknown())
    body = await answer(SUBMIT, submission(), runtime=runtime)

    assert body["data"] is None
    [error] = body["errors"]
    assert error["extensions"] == {"code": "UNAVAILABLE", "retryable": True}
    assert "same key" in error["message"]
    assert runtime.calls == ["submit"]


async def test_a_submission_while_the_server_shuts_down_answers_shutting_down() -> None:
    runtime = StandInRuntime(fail=ShuttingDown())
    body = await answer(SUBMIT, submission(), runtime=runtime)

    assert body["data"] is None
    [error] = body["errors"]
    assert error["extensions"] == {"code": "SHUTTING_DOWN", "retryable": True}
    assert error["path"] == ["submitTurn"]
    assert runtime.calls == ["submit"]


async def test_a_subscription_to_an_unknown_session_answers_not_found_not_retryable() -> None:
    missing = uuid.uuid4()
    runtime = StandInRuntime(fail=NotFound(f"session {missing} not found"))
    body = await first_message(SESSION_EVENTS, {"s": str(missing)}, runtime=runtime)

    [error] = body["errors"]
    assert error["message"] == f"session {missing} not found"
    assert error["extensions"] == {"code": "NOT_FOUND", "retryable": False}


async def test_a_subscription_to_a_session_id_that_is_no_uuid_is_not_found_at_once() -> None:
    runtime = StandInRuntime()
    body = await first_message(SESSION_EVENTS, {"s": "not-a-uuid"}, runtime=runtime)

    [error] = body["errors"]
    assert error["extensions"] == {"code": "NOT_FOUND", "retryable": False}
    assert runtime.calls == []


async def test_a_subscription_to_a_known_session_streams_its_events() -> None:
    runtime = StandInRuntime()
    body = await first_message(SESSION_EVENTS, {"s": str(SESSION.id)}, runtime=runtime)

    assert body == {"data": {"sessionEvents": {"seq": 1, "type": "turn.started"}}}


async def test_asking_for_too_many_sessions_is_bad_user_input_and_reads_nothing() -> None:
    runtime = StandInRuntime()
    body = await answer("{ sessions(first: 1000) { totalCount } }", runtime=runtime)

    assert body["data"] is None
    [error] = body["errors"]
    assert error["message"] == "first must be at most 100 (got 1000)"
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "retryable": False}
    assert runtime.calls == []


async def test_an_invalid_argument_raised_below_the_resolvers_is_bad_user_input() -> None:
    runtime = StandInRuntime(fail=InvalidArgument("after is not a cursor this API gave out"))
    body = await answer("{ sessions { totalCount } }", runtime=runtime)

    [error] = body["errors"]
    assert error["message"] == "after is not a cursor this API gave out"
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "retryable": False}


async def test_a_page_of_sessions_within_the_maximum_is_answered() -> None:
    runtime = StandInRuntime()
    body = await answer(
        "{ sessions(first: 100) { totalCount edges { node { id } } } }", runtime=runtime
    )

    assert body == {
        "data": {"sessions": {"totalCount": 1, "edges": [{"node": {"id": str(SESSION.id)}}]}}
    }
    assert runtime.calls == ["reads.sessions"]


# -- (b) an invalid request is a union member, and nothing is asked of the runtime -


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"idempotencyKey": ""}, "idempotencyKey"),
        ({"idempotencyKey": "k" * 256}, "idempotencyKey"),
        ({"idempotencyKey": "line\nbreak"}, "idempotencyKey"),
        ({"sessionId": "not-a-uuid"}, "sessionId"),
        ({"input": ""}, "input"),
        ({"input": "nul\x00byte"}, "input"),
    ],
    ids=["empty-key", "long-key", "control-key", "bad-session-id", "empty-input", "nul-input"],
)
async def test_an_invalid_submission_answers_invalid_input_naming_the_field(
    overrides: dict[str, Any], field: str
) -> None:
    runtime = StandInRuntime()
    body = await answer(SUBMIT, submission(**overrides), runtime=runtime)

    assert "errors" not in body
    result = body["data"]["submitTurn"]
    assert result["__typename"] == "InvalidInput"
    assert result["code"] == "INVALID_INPUT"
    assert result["field"] == field
    assert field in result["message"]
    assert runtime.calls == []


async def test_a_valid_submission_reaches_the_runtime_and_answers_the_admission() -> None:
    runtime = StandInRuntime()
    body = await answer(SUBMIT, submission(), runtime=runtime)

    assert body == {
        "data": {
            "submitTurn": {
                "__typename": "TurnAccepted",
                "replayed": False,
                "turn": {"id": str(TURN.id), "status": "QUEUED"},
            }
        }
    }
    assert runtime.calls == ["submit"]


async def test_a_resolution_with_an_empty_key_answers_invalid_input_and_writes_nothing() -> None:
    runtime = StandInRuntime()
    variables = {"input": {"turnId": str(TURN.id), "action": "RETRY", "idempotencyKey": ""}}
    body = await answer(RESOLVE, variables, runtime=runtime)

    assert "errors" not in body
    result = body["data"]["resolveInterruptedTurn"]
    assert (result["__typename"], result["field"]) == ("InvalidInput", "idempotencyKey")
    assert runtime.calls == []


async def test_a_valid_resolution_reaches_the_runtime() -> None:
    runtime = StandInRuntime()
    variables = {"input": {"turnId": str(TURN.id), "action": "ABANDON", "idempotencyKey": "r-1"}}
    body = await answer(RESOLVE, variables, runtime=runtime)

    assert body == {
        "data": {"resolveInterruptedTurn": {"__typename": "TurnNotFound", "turnId": str(TURN.id)}}
    }
    assert runtime.calls == ["resolve_interrupted"]


# -- (c) limits: refused at validation, before any resolver ----------------------

# The deepest document the schema allows: eight fields, seven of them with a
# selection set (what the depth limit counts).
DEEPEST = """{ sessions { edges { node {
  turns { edges { node { events(first: 20) { data } } } } } } } }"""
DEEPEST_DEPTH = 7


async def test_the_deepest_query_the_schema_has_is_within_max_depth() -> None:
    runtime = StandInRuntime()
    body = await answer(DEEPEST, runtime=runtime)

    assert "errors" not in body
    turns = body["data"]["sessions"]["edges"][0]["node"]["turns"]
    assert turns["edges"][0]["node"]["events"] == [{"data": {"input": "hello"}}]
    assert runtime.calls == ["reads.sessions", "reads.turns_batch", "reads.turn_event_pages"]


@pytest.mark.parametrize("limit", [DEEPEST_DEPTH - 1, 3])
async def test_a_query_deeper_than_the_depth_limit_is_refused_before_any_resolver(
    limit: int,
) -> None:
    runtime = StandInRuntime()
    body = await answer(DEEPEST, runtime=runtime, on=build_schema(max_depth=limit))

    assert body["data"] is None
    assert messages(body) == [f"'anonymous' exceeds maximum operation depth of {limit}"]
    assert runtime.calls == []


async def test_a_document_deeper_than_max_depth_is_refused_by_the_served_schema() -> None:
    # The schema has no cycle, so a document this deep must name fields that
    # do not exist; the depth limit refuses it all the same.
    nested = "".join("edges { node { " for _ in range(MAX_DEPTH))
    document = "query Deep { sessions { " + nested + "id" + " } }" * MAX_DEPTH + " } }"
    runtime = StandInRuntime()
    body = await answer(document, runtime=runtime)

    assert body["data"] is None
    assert f"'Deep' exceeds maximum operation depth of {MAX_DEPTH}" in messages(body)
    assert runtime.calls == []


def aliased_sessions(count: int) -> str:
    return "{ " + " ".join(f"s{i}: sessions {{ totalCount }}" for i in range(count)) + " }"


async def test_max_aliases_aliases_are_answered() -> None:
    runtime = StandInRuntime()
    body = await answer(aliased_sessions(MAX_ALIASES), runtime=runtime)

    assert "errors" not in body
    assert body["data"] == {f"s{i}": {"totalCount": 1} for i in range(MAX_ALIASES)}
    assert runtime.calls == ["reads.sessions"] * MAX_ALIASES


async def test_one_alias_more_than_max_aliases_is_refused_before_any_resolver() -> None:
    runtime = StandInRuntime()
    body = await answer(aliased_sessions(MAX_ALIASES + 1), runtime=runtime)

    assert body["data"] is None
    assert messages(body) == [f"{MAX_ALIASES + 1} aliases found. Allowed: {MAX_ALIASES}"]
    assert runtime.calls == []


def token_count(document: str) -> int:
    lexer = Lexer(Source(document))
    count = 0
    while lexer.advance().kind is not TokenKind.EOF:
        count += 1
    return count


def document_of(tokens: int) -> str:
    """A valid document of exactly ``tokens`` tokens: the operation ``Main``
    (one read of sessions) beside as many small operations as it takes. Many
    operations rather than many fields, so that validation stays cheap."""
    main_tokens = 8  # query Main { sessions { totalCount } }
    small, pad = divmod(tokens - main_tokens, 5)  # query Fi { __typename }
    main = "query Main { sessions { totalCount } " + "__typename " * pad + "}"
    document = main + "".join(f" query F{i} {{ __typename }}" for i in range(small))
    assert token_count(document) == tokens
    return document


async def test_a_document_of_max_tokens_is_answered() -> None:
    runtime = StandInRuntime()
    body = await answer(document_of(MAX_TOKENS), runtime=runtime, operation_name="Main")

    assert "errors" not in body
    assert body["data"]["sessions"] == {"totalCount": 1}
    assert runtime.calls == ["reads.sessions"]


async def test_a_document_over_max_tokens_is_refused_before_any_resolver() -> None:
    runtime = StandInRuntime()
    body = await answer(document_of(MAX_TOKENS + 1), runtime=runtime, operation_name="Main")

    assert body["data"] is None
    [message] = messages(body)
    assert f"more than {MAX_TOKENS} tokens" in message
    assert runtime.calls == []


INTROSPECTION = "{ __schema { queryType { name } } }"


async def test_introspection_is_answered_by_default() -> None:
    body = await answer(INTROSPECTION, runtime=StandInRuntime())

    assert body == {"data": {"__schema": {"queryType": {"name": "Query"}}}}


async def test_introspection_is_refused_when_the_schema_is_built_without_it() -> None:
    runtime = StandInRuntime()
    closed = build_schema(introspection=False)

    refused = await answer(INTROSPECTION, runtime=runtime, on=closed)
    assert refused["data"] is None
    assert refused["errors"]
    assert all("introspection has been disabled" in m for m in messages(refused))

    # Ordinary queries are still answered.
    body = await answer("{ sessions { totalCount } }", runtime=runtime, on=closed)
    assert body == {"data": {"sessions": {"totalCount": 1}}}
    assert runtime.calls == ["reads.sessions"]

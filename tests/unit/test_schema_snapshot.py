"""The committed SDL is the contract clients build against: it must match the code."""

from __future__ import annotations

from keyturn.schema import schema
from tests.support import ROOT


def test_schema_graphql_matches_the_code() -> None:
    committed = (ROOT / "schema.graphql").read_text()
    assert committed.strip() == schema.as_str().strip(), (
        "schema.graphql is out of date: run `make schema` and commit the result"
    )


def test_contract_names_are_present() -> None:
    sdl = schema.as_str()
    for fragment in [
        "union SubmitTurnResult = TurnAccepted | TurnReplayed | IdempotencyConflict | "
        "SessionNotFound | InvalidInput | KeyExpired",
        "interface TurnAdmission",
        "interface UserError",
        "turnCompleted(turnId: ID!): Turn!",
        "sessionEvents(sessionId: ID!, afterSeq: Int = 0): Event!",
        # No default in the SDL for first: it may be left out for last/before;
        # left out with no last either, it is 20 (turns) or 100 (events).
        "turns(first: Int = null, after: String = null, last: Int = null, before: String = null)"
        ": TurnConnection!",
        "events(first: Int = null, after: String = null, last: Int = null, before: String = null)"
        ": EventConnection!",
        "interface Node {\n  id: ID!\n}",
        "type Session implements Node",
        "type Turn implements Node",
        "type Event implements Node",
        "node(id: ID!): Node",
        "nodes(ids: [ID!]!): [Node]!",
        "hasPreviousPage: Boolean!",
        "startCursor: String",
        "sessions(first: Int = 20, after: String = null): SessionConnection!",
        "enum TurnStatus {\n  QUEUED\n  RUNNING\n  COMPLETED\n  FAILED\n  INTERRUPTED\n"
        "  CANCELLED\n  WAITING\n}",
        "enum ErrorCode {\n  IDEMPOTENCY_CONFLICT\n  SESSION_NOT_FOUND\n  INVALID_INPUT\n",
        "toolCalls: [ToolCall!]!",
        "retryOf: ID",
        "enum ToolCallState {\n  NOT_STARTED\n  COMPLETED\n  OUTCOME_UNKNOWN\n"
        "  RECONCILED_APPLIED\n  RECONCILED_NOT_APPLIED\n  AWAITING_APPROVAL\n  REJECTED\n}",
        "enum ToolKind {\n  READ_ONLY\n  REPEATABLE\n  IDEMPOTENT\n  UNSAFE\n}",
        "tools: [ToolInfo!]!",
        "resolveInterruptedTurn(input: ResolveInterruptedTurnInput!): "
        "ResolveInterruptedTurnResult!",
        "force: Boolean! = false",
    ]:
        assert fragment in sdl, fragment

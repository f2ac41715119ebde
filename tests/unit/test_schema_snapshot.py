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
        "SessionNotFound | InvalidInput",
        "interface TurnAdmission",
        "interface UserError",
        "turnCompleted(turnId: ID!): Turn!",
        "sessionEvents(sessionId: ID!, afterSeq: Int = 0): Event!",
        "turns(first: Int = 20, after: String = null): TurnConnection!",
        "events(first: Int = 100, after: String = null): EventConnection!",
        "sessions(first: Int = 20, after: String = null): SessionConnection!",
        "enum TurnStatus {\n  QUEUED\n  RUNNING\n  COMPLETED\n  FAILED\n  INTERRUPTED\n}",
        "enum ErrorCode {\n  IDEMPOTENCY_CONFLICT\n  SESSION_NOT_FOUND\n  INVALID_INPUT\n",
        "toolCalls: [ToolCall!]!",
        "retryOf: ID",
        "enum ToolCallState {\n  NOT_STARTED\n  COMPLETED\n  OUTCOME_UNKNOWN\n"
        "  RECONCILED_APPLIED\n  RECONCILED_NOT_APPLIED\n}",
        "enum ToolKind {\n  READ_ONLY\n  IDEMPOTENT\n  UNSAFE\n}",
        "resolveInterruptedTurn(input: ResolveInterruptedTurnInput!): "
        "ResolveInterruptedTurnResult!",
        "force: Boolean! = false",
    ]:
        assert fragment in sdl, fragment

"""Mistakes sent through variables, as every client sends inputs, are the
client's: graphql-core's own message, BAD_USER_INPUT, nothing written, and no
ERROR in the server's log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.support import GraphQLClient

SUBMIT = "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename } }"


def cases(sid: str) -> list[tuple[dict[str, Any] | None, str]]:
    ok = {"sessionId": sid, "idempotencyKey": "k", "input": "hello"}
    return [
        ({"i": {k: v for k, v in ok.items() if k != "idempotencyKey"}}, "idempotencyKey"),
        ({"i": {**ok, "input": 5}}, "String cannot represent a non string value: 5"),
        ({"i": {**ok, "colour": "blue"}}, "'colour'"),
        ({"i": {**ok, "history": "ALL"}}, "Value 'ALL' does not exist in 'HistoryMode' enum"),
        ({"i": None}, "not to be None"),
        (None, "to be provided"),
    ]


@pytest.mark.parametrize("case", range(6))
async def test_a_variable_that_does_not_coerce_is_the_clients_mistake(
    case: int, client: GraphQLClient, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sid = await client.create_session()
    variables, names = cases(sid)[case]
    with caplog.at_level(logging.ERROR):
        response = await client.http.post(
            "/graphql",
            json={"query": SUBMIT, **({"variables": variables} if variables is not None else {})},
        )
    body = response.json()
    [error] = body["errors"]
    assert error["message"].startswith("Variable '$i' has invalid value"), error
    assert names in error["message"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "retryable": False}
    assert body.get("data") is None
    assert await db.fetchval("SELECT count(*) FROM turns") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text

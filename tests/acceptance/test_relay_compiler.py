"""Relay's compiler accepts real operations against schema.graphql: a query, a
refetchable forward connection, the latest events paging backwards, Query.node,
a mutation and a subscription (tests/relay/src)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, npm

RELAY_DIR = ROOT / "tests" / "relay"


@pytest.fixture(scope="module")
def compiler() -> Path:
    npm.installed(RELAY_DIR, ["relay-compiler/cli.js"], "the Relay compiler test")
    return RELAY_DIR / "node_modules" / "relay-compiler" / "cli.js"


def compile_against(
    compiler: Path, workdir: Path, schema: Path
) -> subprocess.CompletedProcess[str]:
    """The operations of tests/relay/src, compiled in a copy (the compiler
    writes its artifacts next to the sources)."""
    shutil.copytree(RELAY_DIR / "src", workdir / "src")
    config = {"src": "./src", "schema": str(schema), "language": "javascript"}
    (workdir / "relay.config.json").write_text(json.dumps(config))
    return subprocess.run(
        ["node", str(compiler)], cwd=workdir, capture_output=True, text=True, timeout=120
    )


def test_the_relay_compiler_accepts_the_schema(compiler: Path, tmp_path: Path) -> None:
    done = compile_against(compiler, tmp_path, ROOT / "schema.graphql")
    assert done.returncode == 0, done.stdout + done.stderr
    generated = sorted(p.name for p in (tmp_path / "src" / "__generated__").iterdir())
    assert "SessionViewTurnsPaginationQuery.graphql.js" in generated  # @refetchable via node
    assert "SessionViewLatestEventsPaginationQuery.graphql.js" in generated
    assert "SubmitTurnMutation.graphql.js" in generated
    assert "SubmitTurnCompletedSubscription.graphql.js" in generated
    # Relay refetches a page of a session's turns through Query.node.
    refetch = tmp_path / "src" / "__generated__" / "SessionViewTurnsPaginationQuery.graphql.js"
    assert "node(id: $id)" in refetch.read_text()


def test_the_compiler_refuses_what_the_schema_does_not_have(compiler: Path, tmp_path: Path) -> None:
    """The check has teeth: an operation asking for a field the schema lacks fails."""
    schema = tmp_path / "schema.graphql"
    schema.write_text((ROOT / "schema.graphql").read_text().replace("  node(id: ID!): Node\n", ""))
    done = compile_against(compiler, tmp_path / "work", schema)
    assert done.returncode != 0
    assert "no field `node`" in done.stdout + done.stderr

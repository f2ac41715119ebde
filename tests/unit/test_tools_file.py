"""The tools file's checks, the kinds read from MCP annotations, and the
fixture's ``/call`` directive."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import types

from keyturn.domain import ToolKind
from keyturn.errors import ModelError, ToolsFileError
from keyturn.runtime.mcp_tools import annotated_kind
from keyturn.runtime.model import ToolRequest, tool_directives
from keyturn.runtime.tools_file import ToolOverride, load

GOOD = """
[servers.files]
command = ["python", "-m", "files_server"]
env = { ROOT = "/srv/files" }
cwd = "servers"

[servers.search]
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer very-secret" }

[tools."files__delete"]
kind = "UNSAFE"

[tools."files__write"]
kind = "IDEMPOTENT"
key_argument = "key"
applied_tool = "files__was_applied"
"""


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text(text)
    return path


def test_a_good_file(tmp_path: Path) -> None:
    path = written(tmp_path, GOOD)
    file = load(path)
    files, search = file.servers
    assert (files.name, files.transport, files.command) == (
        "files",
        "stdio",
        ("python", "-m", "files_server"),
    )
    assert files.env == {"ROOT": "/srv/files"}
    assert files.cwd == str(tmp_path / "servers")  # relative to the file
    assert (search.transport, search.url) == ("http", "http://127.0.0.1:9000/mcp")
    assert "very-secret" not in repr(search)  # header values are secrets
    assert file.overrides == {
        "files__delete": ToolOverride("files__delete", ToolKind.UNSAFE),
        "files__write": ToolOverride(
            "files__write", ToolKind.IDEMPOTENT, "key", "files__was_applied"
        ),
    }


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("[servers", "", "not valid TOML"),
        ("[other]\n", "other", "unknown key (expected servers or tools)"),
        ("[servers.a__b]\ncommand = ['x']\n", "servers.a__b", "no '__'"),
        ("[servers.a]\n", "servers.a", "needs exactly one of command (stdio) or url"),
        ("[servers.a]\ncommand = ['x']\nurl = 'http://h'\n", "servers.a", "exactly one of"),
        ("[servers.a]\ncommand = []\n", "servers.a.command", "non-empty list of strings"),
        ("[servers.a]\ncommand = ['x']\nenv = { A = 1 }\n", "servers.a.env.A", "must be a string"),
        ("[servers.a]\ncommand = ['x']\nheaders = {}\n", "servers.a.headers", "only for a server"),
        ("[servers.a]\ncommand = ['x']\nport = 1\n", "servers.a.port", "unknown key"),
        ("[servers.a]\nurl = 'ftp://h'\n", "servers.a.url", "http:// or https:// URL"),
        (
            "[servers.a]\nurl = 'http://h'\nheaders = { A = true }\n",
            "servers.a.headers.A",
            "string",
        ),
        ("[tools.x]\nkind = 'UNSAFE'\n", 'tools."x"', "must be SERVER__TOOL"),
        ("[tools.b__x]\nkind = 'UNSAFE'\n[servers.a]\ncommand = ['x']\n", 'tools."b__x"', "SERVER"),
    ],
)
def test_each_mistake_is_one_line_naming_the_file_and_the_key(
    tmp_path: Path, text: str, where: str, says: str
) -> None:
    path = written(tmp_path, text)
    with pytest.raises(ToolsFileError) as raised:
        load(path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"KEYTURN_TOOLS_FILE {path}: {where}")
    assert says in message


SERVER = "[servers.a]\ncommand = ['x']\n"


@pytest.mark.parametrize(
    ("override", "where", "says"),
    [
        ("kind = 'SAFE'", "kind", "must be one of READ_ONLY, REPEATABLE, IDEMPOTENT, UNSAFE"),
        ("kind = 'IDEMPOTENT'", "key_argument", "needs the name of the argument"),
        ("kind = 'IDEMPOTENT'\nkey_argument = 'k'", "applied_tool", "a tool of the same server"),
        (
            "kind = 'IDEMPOTENT'\nkey_argument = 'k'\napplied_tool = 'b__ask'",
            "applied_tool",
            "a__TOOL",
        ),
        ("kind = 'UNSAFE'\nkey_argument = 'k'", "key_argument", 'only with kind = "IDEMPOTENT"'),
        ("kind = 'UNSAFE'\nhint = 1", "hint", "unknown key"),
    ],
)
def test_an_idempotent_tool_needs_a_key_argument_and_a_tool_to_ask(
    tmp_path: Path, override: str, where: str, says: str
) -> None:
    path = written(tmp_path, f'{SERVER}[tools."a__t"]\n{override}\n')
    with pytest.raises(ToolsFileError) as raised:
        load(path)
    assert str(raised.value).startswith(f'KEYTURN_TOOLS_FILE {path}: tools."a__t".{where}: ')
    assert says in str(raised.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ToolsFileError, match="cannot read it"):
        load(tmp_path / "absent.toml")


def tool(**hints: bool) -> types.Tool:
    return types.Tool(
        name="t", inputSchema={"type": "object"}, annotations=types.ToolAnnotations(**hints)
    )


@pytest.mark.parametrize(
    ("hints", "kind"),
    [
        ({"readOnlyHint": True}, ToolKind.READ_ONLY),
        ({"readOnlyHint": True, "idempotentHint": False}, ToolKind.READ_ONLY),
        ({"idempotentHint": True}, ToolKind.REPEATABLE),
        ({"idempotentHint": True, "destructiveHint": True}, ToolKind.REPEATABLE),
        ({"destructiveHint": False}, ToolKind.UNSAFE),  # not idempotent by default
        ({}, ToolKind.UNSAFE),
        ({"readOnlyHint": False, "idempotentHint": False}, ToolKind.UNSAFE),
    ],
)
def test_kinds_from_annotations(hints: dict[str, bool], kind: ToolKind) -> None:
    assert annotated_kind(tool(**hints)) is kind


def test_a_tool_without_annotations_is_unsafe() -> None:
    bare = types.Tool(name="t", inputSchema={"type": "object"})
    assert annotated_kind(bare) is ToolKind.UNSAFE


def test_call_directives_in_order_with_the_others() -> None:
    calls = tool_directives(
        '/read x /call files__put {"name": "a", "value": "/write q=1"} /write b=2 /call files__pid'
    )
    assert calls == [
        ToolRequest("synthetic_read", {"name": "x"}),
        # Text inside the JSON is an argument, not another directive.
        ToolRequest("files__put", {"name": "a", "value": "/write q=1"}),
        ToolRequest("synthetic_write", {"name": "b", "value": "2"}),
        ToolRequest("files__pid", {}),
    ]


@pytest.mark.parametrize(
    ("input", "says"),
    [
        ('/call t {"a": 1', "the arguments are not valid JSON on one line"),
        ('/call t {"a":\n 1}', "the arguments are not valid JSON on one line"),
        ("/call t {'a': 1}", "the arguments are not valid JSON on one line"),
    ],
)
def test_call_arguments_that_are_not_a_json_object_are_a_model_error(input: str, says: str) -> None:
    with pytest.raises(ModelError, match=says):
        tool_directives(input)

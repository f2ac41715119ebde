"""The playground's files: what is served, and what the wheel carries."""

from __future__ import annotations

import ast
import re

import pytest

from keyturn.http.playground import SERVED_PATTERNS, SOURCE, is_served, playground_dir
from tests.support import ROOT


def test_setup_py_copies_the_same_files_the_server_serves() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    assigned = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert ast.literal_eval(assigned["SERVED_PATTERNS"]) == SERVED_PATTERNS


def test_a_source_checkout_serves_the_playground_folder() -> None:
    assert playground_dir() == SOURCE == ROOT / "playground"


def test_every_file_the_page_loads_exists_and_is_served() -> None:
    html = (SOURCE / "index.html").read_text()
    script = (SOURCE / "app.js").read_text()
    wanted = re.findall(r'(?:src|href)="([^"#:]+)"', html)
    wanted += re.findall(r'^import .* from "\./([^"]+)";$', script, re.MULTILINE)
    wanted = [w for w in wanted if w != "graphql"]  # the API, not a file
    assert {"app.js", "style.css", "favicon.svg", "vendor/graphql-ws.js"} <= set(wanted)
    for name in wanted:
        assert (SOURCE / name).is_file(), name
        assert is_served(name), name


@pytest.mark.parametrize(
    "path",
    [
        "package.json",
        "package-lock.json",
        "build.mjs",
        "node_modules/graphql-ws/dist/client.js",
        "vendor/deeper/x.js",
        "../keyturn/app.py",
        "vendor",
    ],
)
def test_nothing_else_is_served(path: str) -> None:
    assert not is_served(path)

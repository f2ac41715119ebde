"""The npm packages the client tests drive, installed once from their lock file.

Test files run in parallel processes, and two of them may want the same
``node_modules`` at the same moment: the install holds a file lock, so the
second waits for the first and then finds the packages there.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest


def installed(folder: Path, needs: Iterable[str], what: str) -> Path:
    """``folder`` with ``npm ci`` run in it unless every path of ``needs``
    (relative to its node_modules) is already there. Without node or npm the
    test is skipped, or fails under CI, where ``what`` names what needed them."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"node and npm are needed for {what}")
        pytest.skip("node and npm are not installed")
    needs = tuple(needs)
    with open(folder / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((folder / "node_modules" / path).exists() for path in needs):
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--silent"],
                cwd=folder,
                check=True,
                timeout=300,
            )
    return folder

"""Running ``python -m keyturn …`` as a user would, and what a user reads."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without its Keyturn settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYTURN_")}
    env.pop("DATABASE_URL", None)
    env.update(settings)
    return env


def keyturn(
    *args: str, cwd: Path, timeout: float = 90, **settings: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        env=clean_env(**settings),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_clean_line(result: subprocess.CompletedProcess[str], *, code: int = 2) -> str:
    """The command failed with exactly one line on stderr and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def on_a_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """``keyturn ARGS`` with stdout and stderr on one terminal (a real pty):
    its exit code and what the screen showed."""
    main, side = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyturn", *args],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=side,
            stderr=side,
        )
        os.close(side)
        screen = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            screen += chunk
        return proc.wait(60), screen.decode()
    finally:
        os.close(main)

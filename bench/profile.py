"""``--profile``: py-spy on one Keyturn worker during row c, and the frames
with the most samples, for the JSON."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

from bench.rows import progress


class Profile(TypedDict):
    samples: int
    inclusive: list[tuple[str, float]]  # frame, % of samples with it on the stack
    self: list[tuple[str, float]]  # frame, % of samples with it on top


def start_profile(pid: int, out: Path, duration: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        progress("py-spy not found (pip install py-spy); no profile")
        return None
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, int(duration))),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summarize_profile(path: Path, top: int = 25) -> Profile:
    """Collapsed stacks → the frames with the most samples, inclusive and self."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n

    def pct(d: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(d.items(), key=lambda kv: -kv[1])[:top]
        return [(k, round(100 * v / max(1, total), 1)) for k, v in ranked]

    return {"samples": total, "inclusive": pct(inclusive), "self": pct(own)}

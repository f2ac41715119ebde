"""Showing the interruption experiment: a progress line while it runs, the
table when it is done."""

from __future__ import annotations

import time
from typing import Any, TextIO


class Progress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:5.1f}s] {text}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def table(summary: dict[str, Any]) -> str:
    header = ("point", "tool", "kind", "runs", "record says", "store says", "agreed",
              "uncertain", "contradicted", "broken")  # fmt: skip
    lines = [
        (
            r["point"],
            r["tool"],
            r["kind"],
            str(r["runs"]),
            _counts(r["record"]),
            _counts(r["store"]),
            str(r["agreed"]),
            str(r["uncertain"]),
            str(r["contradicted"]),
            str(r["broken"]),
        )
        for r in summary["rows"]
    ]
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [fmt(header), fmt(tuple("-" * w for w in widths))]
    out += [fmt(x) for x in lines]
    earlier, later = summary["earlierCalls"], summary["laterCalls"]
    out.append("")
    out.append(
        f"The calls before the point, in every turn: {_counts(earlier)}. "
        f"The call after it, in the cancelled turns: {_counts(later) or 'none'}. "
        f"Contradictions in all: {summary['contradictions']}; broken cancels or retries: "
        f"{summary['broken']}. ({summary['runsPerPoint']} runs per point, {summary['seconds']} s)"
    )
    return "\n".join(out)

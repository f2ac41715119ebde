"""`make bench` at a tiny size, so the benchmark cannot rot. No timing is asserted:
numbers live in the benchmark's output, never in pass/fail tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

ROWS = {"a.many", "a.hot", "b.many", "b.hot", "b'.many", "b'.hot", "c.many", "c.hot"}
ROWS |= {"d.many", "d.hot", "c½", "e", "f", "f'"}
TARGETS = {"c/b", "c/a", "d/c", "c_half_p99", "fanout_p99", "sub_kib", "page_p50"}


def test_peer_fingerprint_is_keyturns() -> None:
    from bench.common import fingerprint as peer_fingerprint
    from keyturn.domain import History
    from keyturn.runtime.validation import fingerprint

    for text in ("hello", "héllo \u2028 wörld", "/sleep 5"):
        for history in History:
            assert peer_fingerprint(input=text, history=history.value) == fingerprint(
                input=text, history=history
            )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_smoke_writes_every_row(server_url: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--database", server_url,
         "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    result = json.loads((tmp_path / "smoke.json").read_text())
    assert {row["id"] for row in result["rows"]} == ROWS
    for row in result["rows"]:
        if row["id"] != "e":
            assert row["throughput"] is not None and row["throughput"] > 0, row
        assert row["p50_ms"] is not None and row["p99_ms"] is not None, row
    answers = {row["id"]: row["detail"].get("answers") for row in result["rows"]}
    for rid in ("a.many", "a.hot", "b.many", "b.hot", "c.many", "c.hot"):
        assert answers[rid]["accepted"] > 0 and answers[rid]["other"] == 0, (rid, answers[rid])
    for rid in ("b'.many", "b'.hot", "d.many", "d.hot"):
        assert answers[rid]["replayed"] > 0, (rid, answers[rid])
        assert answers[rid]["accepted"] == answers[rid]["other"] == 0, (rid, answers[rid])
    assert {t["key"] for t in result["targets"]} == TARGETS
    assert all(t["measured"] is not None for t in result["targets"])
    for scope in ("many", "hot"):
        assert set(result["ratios"][scope]) >= {"c/a", "c/b", "d/c"}
    fan = next(row for row in result["rows"] if row["id"] == "e")["detail"]
    assert fan["delivered"] + fan["late_subscribers"] == fan["listeners"]

    png = (tmp_path / "smoke.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "targets" in proc.stdout

"""`make bench` at a tiny size, so the benchmark cannot rot. No timing is asserted:
numbers live in the benchmark's output, never in pass/fail tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

ROWS = {"a.many", "a.hot", "b.many", "b.hot", "b'.many", "b'.hot", "c.many", "c.hot"}
ROWS |= {"d.many", "d.hot", "c½", "e", "f", "f'"}
TARGETS = {"c/b", "d/b'", "f/f'", "c_half_p99", "fanout_p99", "sub_kib"}
TARGETS |= {"c/a", "d/c", "page_p50"}


def _bench(module: str, *args: str) -> str:
    """``python -m module args`` from the checkout; its output, once it has
    ended well."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_peer_fingerprint_is_keyturns() -> None:
    from bench.common import fingerprint as peer_fingerprint
    from keyturn.domain import History
    from keyturn.runtime.validation import fingerprint

    for text in ("hello", "héllo \u2028 wörld", "/sleep 5"):
        for history in History:
            assert peer_fingerprint(input=text, history=history.value) == fingerprint(
                input=text, history=history
            )


def test_a_target_is_met_at_what_it_must_reach_and_its_goal_beyond() -> None:
    from bench.targets import Target, judge, line

    ratio = Target("c/b", "new keys / the peer's", ">=", 0.6, 1.0, "x")
    latency = Target("p99", "p99", "<=", 25.0, 10.0, "ms")
    cases: list[tuple[Target, float | None, str]] = [(ratio, 0.59, "NOT met"), (ratio, 0.6, "met")]
    cases += [(ratio, 1.0, "goal met")]
    cases += [(latency, 25.1, "NOT met"), (latency, 25.0, "met"), (latency, 9.9, "goal met")]
    cases += [(ratio, None, "n/a"), (ratio, float("nan"), "n/a")]
    for target, value, verdict in cases:
        judged = judge(target, value)
        assert judged["verdict"] == verdict, (target, value, judged)
        assert judged["verdict"] in line(judged) and "must " + judged["target"] in line(judged)
        assert "smoke" not in line(judged)
    smoke = judge(ratio, 0.7, smoke=True)
    assert smoke["verdict"] == "met" and "(smoke: sizes too small to judge)" in line(smoke)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_smoke_writes_every_row(server_url: str, tmp_path: Path) -> None:
    stdout = _bench("bench.run", "--smoke", "--database", server_url, "--out", str(tmp_path))

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
    for target in result["targets"]:
        assert target["measured"] is not None, target
        # Judged like a full run's, but marked: smoke sizes say nothing.
        assert target["verdict"] in ("goal met", "met", "NOT met"), target
        assert target["met"] == (target["verdict"] != "NOT met"), target
        assert target["judged"] is False, target
    for scope in ("many", "hot"):
        assert set(result["ratios"][scope]) >= {"c/a", "c/b", "d/c"}
    fan = next(row for row in result["rows"] if row["id"] == "e")["detail"]
    assert fan["delivered"] + fan["late_subscribers"] == fan["listeners"]

    png = (tmp_path / "smoke.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    # After the table, one line per target: measured, must reach, goal, verdict.
    printed = stdout[stdout.index("targets (measured, must reach, goal)") :]
    for target in result["targets"]:
        lines = [x for x in printed.splitlines() if x.split()[:1] == [target["key"]]]
        assert len(lines) == 1, (target["key"], printed)
        assert f"must {target['target']}" in lines[0], lines[0]
        assert target["verdict"] in lines[0], lines[0]
        assert "(smoke: sizes too small to judge)" in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("what", ["page", "replay", "new"])
def test_instructions_per_request_are_counted(server_url: str, what: str) -> None:
    """bench.instructions runs its requests under callgrind and reports their
    count; it stops with the answer if any was not the one expected."""
    if shutil.which("valgrind") is None or shutil.which("vgdb") is None:
        reason = "no valgrind (apt-get install valgrind)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: bench.instructions must be tried in CI")
        pytest.skip(reason)
    out = _bench("bench.instructions", what, "--requests", "16", "--database", server_url)
    line = out.strip().splitlines()[-1]
    assert line.startswith(f"keyturn {what}: ") and line.endswith(" M instructions per request")
    # Tens of thousands of Python bytecodes at least; not a count of nothing.
    assert 0.1 < float(line.split()[2]) < 100, line

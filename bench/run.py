"""``make bench``: Keyturn beside its floor and a REST peer, in one run, on one PostgreSQL.

Rows (the same concurrency for each; "many" = 64 sessions, "hot" = one session):
  a   floor: the admission statement straight through asyncpg, one process
  b   peer: the hand-written REST service (bench/peer.py), new keys
  b'  peer: the same keys again (replays)
  c   Keyturn submitTurn over HTTP, new keys (wrk)
  d   Keyturn submitTurn, the same keys again (replays)
  c½  Keyturn submitTurn, open loop at half of c's throughput (latency under load)
  e   turnCompleted fan-out: listeners over the worker processes, commit → delivery
  f   reading: a session of 10,000 events in pages of 100 (Keyturn, and the peer as f')

Each target gets its own database (copied from one migrated template) on the
same server, so no row reads tables another row grew. The table is printed,
written as JSON and drawn as a PNG under bench/results/.
"""

from __future__ import annotations

import asyncio
import resource
import shutil
import tempfile
import time
from pathlib import Path

from bench import admission, report
from bench.chart import draw
from bench.fanout import Fanout, fanout_row
from bench.load import choose_client, wrk_version
from bench.profile import summarize_profile
from bench.reading import reading_row
from bench.rows import Row, progress
from bench.seed import make_event_session, session_files
from bench.servers import (
    database_server,
    port_of,
    server_version,
    start_keyturn,
    start_peer,
    target_databases,
)
from bench.sizes import ROOT, Config, parse_args


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    client = choose_client(cfg)
    # Every listener of row e is a socket in this process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * cfg.listeners + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    cfg.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="keyturn-bench-run-"))
    started = time.perf_counter()
    rows: dict[str, Row] = {}
    extra: dict[str, object] = {}
    fan: Fanout | None = None

    def keep(*measured: Row) -> None:
        rows.update((row.id, row) for row in measured)

    with database_server(cfg.database) as (admin_url, where):
        progress(f"database: {where}")
        version = server_version(admin_url)
        with target_databases(admin_url) as urls:
            files = session_files(cfg, urls, tmp)
            keep(*admission.floor_rows(cfg, urls["floor"], files))

            progress(f"starting the REST peer ({cfg.workers} workers)")
            peer = start_peer(cfg, urls["peer"], tmp)
            try:
                port = port_of(peer)
                keep(*admission.peer_rows(cfg, client, port, files))
                progress("f' peer reading")
                sid = asyncio.run(make_event_session(urls["peer"], cfg.events, cfg.history))
                keep(reading_row(cfg, client, port, "rest", sid, tmp, "f'", "REST peer"))
            finally:
                peer.stop()

            progress(f"starting keyturn serve --workers {cfg.workers}")
            url = urls["keyturn"]
            kt, pids = start_keyturn(cfg, url, tmp)
            try:
                port = port_of(kt)
                progress(f"  worker pids {pids}")
                extra["drain_warmup"] = admission.keyturn_warmup(cfg, client, port, url, files)
                # The hot session's rows come last: its backlog of queued turns
                # may outlast the drain wait, and must not run under e and f.
                keep(*admission.keyturn_rows(cfg, client, port, pids, url, files, "many"))
                progress("f Keyturn reading")
                sid = asyncio.run(make_event_session(url, cfg.events, cfg.history))
                keep(reading_row(cfg, client, port, "graphql", sid, tmp, "f", "Keyturn"))
            finally:
                kt.stop()
            # Row e on fresh processes: memory per subscription is read as the
            # growth of RSS, and a heap that rows c, d and f grew and freed
            # takes new connections in without growing (measured: 13 KiB per
            # idle subscription there, 38 KiB on a fresh server).
            progress(f"starting keyturn serve --workers {cfg.workers} again, for row e")
            kt, pids = start_keyturn(cfg, url, tmp)
            try:
                port = port_of(kt)
                fan_row, fan = fanout_row(cfg, port, pids, url)
                keep(fan_row)
                keep(*admission.keyturn_rows(cfg, client, port, pids, url, files, "hot"))
            finally:
                kt.stop()

    database = f"{where}, PostgreSQL {version}"
    used = wrk_version() if client == "wrk" else "Python client (bench/loadgen.py)"
    run_meta = report.meta(cfg, database, used, time.perf_counter() - started)
    result = report.result(run_meta, rows, fan, extra)
    if cfg.profile and (cfg.out / "profile-c.txt").exists():
        result["profile_c"] = summarize_profile(cfg.out / "profile-c.txt")
    report.print_table(result)
    write(cfg, result)
    shutil.rmtree(tmp, ignore_errors=True)
    progress(f"done in {time.perf_counter() - started:.0f}s")
    return 0


def write(cfg: Config, result: report.Result) -> None:
    stem = "smoke" if cfg.smoke else "latest"
    json_path = cfg.out / f"{stem}.json"
    png_path = cfg.out / f"{stem}.png"
    report.write_json(result, json_path)
    draw(result, png_path)
    for path in (json_path, png_path):
        progress(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    raise SystemExit(main())

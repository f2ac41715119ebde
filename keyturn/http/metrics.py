"""Prometheus metrics, served at ``/metrics``.

One process (``keyturn serve``) serves its own registry. With ``--workers N``
the processes share one port, so a scrape reaches any one of them: then
``keyturn serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory
before the workers start, every worker writes its samples there, and whichever
answers the scrape sums them all (prometheus-client's multiprocess mode).

Counters and the latency histogram are updated where things happen; gauges
that describe a process (the request and work pools, subscriptions, running
turns) are sampled once a second by each process, so that multiprocess mode
sees them too. Turns by status come from the database at scrape time: the
record is the truth, and it is the same whichever process answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from starlette.requests import Request
from starlette.responses import Response

from keyturn.db import probes
from keyturn.db.engine import connect
from keyturn.domain import TurnStatus
from keyturn.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from keyturn.runtime.process import Runtime

log = logging.getLogger(__name__)

ADMISSIONS = Counter(
    "keyturn_admissions",
    "Submissions answered, by outcome (accepted, replayed, conflict, expired, "
    "session_not_found, unavailable)",
    ["outcome"],
)
ADMISSION_SECONDS = Histogram(
    "keyturn_admission_seconds",
    "Time to answer a submission (admission only, not the turn)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
INTERRUPTIONS = Counter(
    "keyturn_interruptions", "Turns marked INTERRUPTED by this process (an expired lease)"
)
SUBSCRIPTIONS = Gauge(
    "keyturn_subscriptions_open",
    "Live subscribers (sessionEvents, turnEvents, turnCompleted)",
    multiprocess_mode="livesum",
)
RUNNING = Gauge(
    "keyturn_turns_running_here", "Turns this process runs now", multiprocess_mode="livesum"
)
POOL_IN_USE = Gauge(
    "keyturn_pool_connections_in_use",
    "Database connections checked out of the pool",
    multiprocess_mode="livesum",
)
POOL_SIZE = Gauge(
    "keyturn_pool_connections_size",
    "Database connections the pool keeps",
    multiprocess_mode="livesum",
)
POOL_WAITING = Gauge(
    "keyturn_pool_checkouts_waiting",
    "Requests waiting for a database connection of the pool, in the order they came",
    multiprocess_mode="livesum",
)
WORK_POOL_IN_USE = Gauge(
    "keyturn_work_pool_connections_in_use",
    "Database connections checked out of the worker's pool (claims, renewals, finishes)",
    multiprocess_mode="livesum",
)
WORK_POOL_SIZE = Gauge(
    "keyturn_work_pool_connections_size",
    "Database connections the worker's pool keeps",
    multiprocess_mode="livesum",
)
WORK_POOL_WAITING = Gauge(
    "keyturn_work_pool_checkouts_waiting",
    "The worker's writes waiting for a database connection of its pool",
    multiprocess_mode="livesum",
)
LISTENER_RECONNECTS = Counter(
    "keyturn_listener_reconnects", "Times the LISTEN connection was lost and opened again"
)
RETENTION_PASSES = Counter(
    "keyturn_retention_passes", "Passes of the retention sweeper run by this process"
)
RETENTION_PRUNED = Counter(
    "keyturn_retention_pruned",
    "Rows the retention sweeper removed, by what: turns (moved to tombstones), events "
    "(data blanked), tombstones (forgotten); counted batch by batch as a pass runs",
    ["what"],
)


# ADMISSIONS' child for each outcome, once it has been counted.
_ADMITTED: dict[str, Counter] = {}


class PrometheusStats:
    """The runtime's :class:`~keyturn.runtime.stats.Stats`, fed into this
    process's registry."""

    def admitted(self, outcome: str, seconds: float) -> None:
        counter = _ADMITTED.get(outcome)
        if counter is None:
            # labels() takes the metric's lock and builds its key every call.
            counter = _ADMITTED[outcome] = ADMISSIONS.labels(outcome)
        counter.inc()
        ADMISSION_SECONDS.observe(seconds)

    def retention_batch(self, *, turns: int, events: int, tombstones: int) -> None:
        RETENTION_PRUNED.labels("turns").inc(turns)
        RETENTION_PRUNED.labels("events").inc(events)
        RETENTION_PRUNED.labels("tombstones").inc(tombstones)

    def retention_pass(self) -> None:
        RETENTION_PASSES.inc()


class _TurnsByStatus(Collector):
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def collect(self) -> list[Metric]:
        family = GaugeMetricFamily(
            "keyturn_turns", "Turns in the database by status", labels=["status"]
        )
        for status in TurnStatus:
            family.add_metric([status], self.counts.get(status, 0))
        return [family]


async def _turn_counts(runtime: Runtime) -> dict[str, int] | None:
    try:
        async with connect(runtime.engine) as conn:
            return await probes.turns_by_status(conn)
    except DatabaseUnavailable:
        log.warning("metrics: could not count turns")
        return None


def sample(runtime: Runtime) -> None:
    """Copy this process's gauges from the runtime."""
    POOL_IN_USE.set(runtime.engine.checkedout())
    POOL_SIZE.set(runtime.engine.size())
    POOL_WAITING.set(runtime.engine.waiting())
    WORK_POOL_IN_USE.set(runtime.work_engine.checkedout())
    WORK_POOL_SIZE.set(runtime.work_engine.size())
    WORK_POOL_WAITING.set(runtime.work_engine.waiting())
    SUBSCRIPTIONS.set(runtime.bus.subscriber_count)
    RUNNING.set(runtime.worker.running_count)
    for attr, counter in (("interrupted", INTERRUPTIONS), ("reconnects", LISTENER_RECONNECTS)):
        owner = runtime.worker if attr == "interrupted" else runtime.listener
        now = int(getattr(owner, attr, 0))
        seen = _seen.get(attr, 0)
        if now > seen:
            counter.inc(now - seen)
        _seen[attr] = now


_seen: dict[str, int] = {}


async def sample_forever(runtime: Runtime, every_s: float = 1.0) -> None:
    """Keeps this process's gauges current while the app runs (supervised)."""
    while True:
        sample(runtime)
        await asyncio.sleep(every_s)


def _multiprocess(runtime: Runtime | None) -> bool:
    return runtime is not None and runtime.settings.metrics_multiproc_dir is not None


def process_stopped(runtime: Runtime) -> None:
    """In multiprocess mode, this process's live gauges stop counting."""
    if _multiprocess(runtime):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


async def endpoint(request: Request) -> Response:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    registry = CollectorRegistry()
    if _multiprocess(runtime):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Everything())
    if runtime is not None:
        sample(runtime)
        counts = await _turn_counts(runtime)
        if counts is not None:
            registry.register(_TurnsByStatus(counts))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _Everything(Collector):
    """The process's default registry (metrics above, process and platform)."""

    def collect(self) -> Any:
        return REGISTRY.collect()

"""Statistics that keep up with a young table (:mod:`keyturn.db.planner`):
a supervised task of every process."""

from __future__ import annotations

import asyncio
import logging

from keyturn.db import planner
from keyturn.db.engine import Engine, connect
from keyturn.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# How often a process looks: the plans its connections keep meanwhile are
# the ones made from the statistics before. One read of the catalog.
INTERVAL_S = 1.0


async def keep_statistics(engine: Engine, *, interval_s: float = INTERVAL_S) -> None:
    """Every ``interval_s``, analyze the tables whose statistics are too
    small for them (:meth:`~keyturn.db.planner.TableSize.outgrown`). A table
    is tried again only once its rows have doubled since this process last
    tried: an analyze that failed (a statement timeout on a large table,
    say) is not repeated every second, and one skipped because another
    process or autovacuum was analyzing the table is theirs to finish."""
    tried_at: dict[str, int] = {}
    while True:
        try:
            async with connect(engine) as conn:
                due = [t for t in await planner.sizes(conn) if t.outgrown(tried_at.get(t.name, 0))]
                if due:
                    tried_at.update((t.name, t.live) for t in due)
                    await planner.analyze(conn, [t.name for t in due])
                    log.info(
                        "analyzed for the planner: %s",
                        ", ".join(
                            f"{t.name} ({t.live} rows, statistics of {t.counted})" for t in due
                        ),
                    )
        except DatabaseUnavailable:
            pass  # the next look reads the sizes again
        await asyncio.sleep(interval_s)

"""The first statistics of a new database (:mod:`keyturn.db.planner`): a
supervised task of every process, over once each table has them."""

from __future__ import annotations

import asyncio
import logging

from keyturn.db import planner
from keyturn.db.engine import Engine, connect
from keyturn.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# How often a process looks: the plans its connections keep meanwhile are
# the ones made without statistics.
INTERVAL_S = 1.0


async def first_statistics(engine: Engine, *, interval_s: float = INTERVAL_S) -> None:
    """Every ``interval_s``, analyze the tables that have grown past
    ``MIN_PAGES`` on statistics from fewer pages. Returns once no table is
    left on such statistics, or each one left was analyzed by this process
    already (one it may not analyze, owned by another role, is not asked
    again: PostgreSQL skips it with a warning). On a database whose tables
    stay small, it keeps looking: one read of the catalog a second."""
    tried: set[str] = set()
    while True:
        try:
            async with connect(engine) as conn:
                small = await planner.small_tables(conn)
                grown = [t.name for t in small if t.grown and t.name not in tried]
                if grown:
                    await planner.analyze(conn, grown)
                    tried.update(grown)
                    log.info(
                        "analyzed %s: the first statistics of %s for the planner",
                        ", ".join(grown),
                        "this table" if len(grown) == 1 else "these tables",
                    )
        except DatabaseUnavailable:
            pass  # the next look tries again
        else:
            if all(t.name in tried for t in small):
                return
        await asyncio.sleep(interval_s)

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
    small for them (:attr:`~keyturn.db.planner.TableSize.outgrown`). A
    table another process was analyzing at that moment is looked at again
    on the next round."""
    while True:
        try:
            async with connect(engine) as conn:
                due = [t for t in await planner.sizes(conn) if t.outgrown]
                if due:
                    await planner.analyze(conn, [t.name for t in due])
                    log.info(
                        "analyzed for the planner: %s",
                        ", ".join(
                            f"{t.name} ({t.live} rows, statistics of {t.counted})" for t in due
                        ),
                    )
        except DatabaseUnavailable:
            pass  # the next look tries again
        await asyncio.sleep(interval_s)

"""What the runtime counts, for whoever publishes it.

The runtime knows nothing of Prometheus or HTTP: it reports events to a
:class:`Stats` it is given (``keyturn.http.metrics`` supplies one that feeds
the ``/metrics`` registry), and exposes its gauges as attributes the sampler
reads (running turns, subscribers, interruptions, listener reconnects).
"""

from __future__ import annotations

from typing import Protocol


class Stats(Protocol):
    def admitted(self, outcome: str, seconds: float) -> None:
        """A submission was answered with ``outcome`` (an AdmissionOutcome
        value, or ``unavailable``) after ``seconds``."""

    def retention_batch(self, *, turns: int, events: int, tombstones: int) -> None:
        """A batch of a retention pass committed: it pruned ``turns`` (blanking
        ``events``) and forgot ``tombstones``. Reported per batch, while the
        pass runs."""

    def retention_pass(self) -> None:
        """A retention pass ended (its batches were reported one by one)."""


class NoStats:
    """Counts nothing: for a runtime nobody scrapes (tests, commands)."""

    def admitted(self, outcome: str, seconds: float) -> None:
        pass

    def retention_batch(self, *, turns: int, events: int, tombstones: int) -> None:
        pass

    def retention_pass(self) -> None:
        pass

"""``keyturn experiment interruption``: what the record can establish when a
server dies, or a turn is cancelled, in the middle of a tool call. Running
it (``running``), judging each call (``judging``), and showing the result
(``rendering``)."""

from keyturn.ops.experiment.judging import summarize, verdict
from keyturn.ops.experiment.rendering import table
from keyturn.ops.experiment.running import run_interruption

__all__ = ["run_interruption", "summarize", "table", "verdict"]

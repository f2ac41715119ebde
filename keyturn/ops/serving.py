"""Running uvicorn, with a Ctrl-C pressed while it starts meaning a stop.

Python's own SIGINT handler raises KeyboardInterrupt wherever the interpreter
happens to be. Raised inside a weakref callback or a ``__del__`` (frequent
while modules are imported: uvicorn's, the application's) it is printed as
"Exception ignored" with a traceback and then dropped, and the start goes on
as if nothing had been pressed: the server comes up and runs. So once the
database is up (:class:`Presses`, installed before anything heavy is
imported) a press is only remembered, and handed to uvicorn the moment it
listens for signals itself; uvicorn then finishes starting and stops at
once, as after any Ctrl-C, and the command exits 130. This module imports
uvicorn only in :func:`run`, under that handler.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

APP = "keyturn.http.app:create_app"
# Named, not imported: uvicorn imports them in each worker. uvicorn's own
# protocols, writing less often (keyturn.http.http11, keyturn.http.websockets).
HTTP = "keyturn.http.http11:HTTP"
WEBSOCKETS = "keyturn.http.websockets:WebSockets"
INTERRUPTED = 128 + signal.SIGINT


class Presses:
    """SIGINT handler that remembers, never raises."""

    def __init__(self) -> None:
        self.pressed = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        self.pressed = True

    @classmethod
    def install(cls) -> Presses:
        presses = cls()
        signal.signal(signal.SIGINT, presses)
        return presses


def run(*, presses: Presses, workers: int, **options: Any) -> int:
    """Serve until stopped; the exit code: 0 after a stop, 130 if Ctrl-C came
    before the server listened for it."""
    import uvicorn

    if presses.pressed:
        return INTERRUPTED
    if workers > 1:
        # The supervisor of several processes imports no application and
        # installs its own handlers at once: Python's handler serves until then.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if presses.pressed:
            return INTERRUPTED
        uvicorn.run(APP, factory=True, workers=workers, **options)
        return 0

    class Server(uvicorn.Server):
        pressed_while_starting = False

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                if presses.pressed:
                    self.pressed_while_starting = True
                    self.handle_exit(signal.SIGINT, None)
                yield

    server = Server(uvicorn.Config(APP, factory=True, **options))
    server.run()
    if server.pressed_while_starting:
        return INTERRUPTED
    # As uvicorn.run: a server that never started (its startup failed and
    # said why) is exit 3.
    return 0 if server.started else 3

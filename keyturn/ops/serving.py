"""Running uvicorn, with a Ctrl-C pressed while it starts meaning a stop.

Python's own SIGINT handler raises KeyboardInterrupt wherever the interpreter
happens to be. Raised inside a weakref callback or a ``__del__`` (frequent
while the application's modules are imported) it is printed as "Exception
ignored" with a traceback and then dropped, and the start goes on as if
nothing had been pressed: the server comes up and runs. So once the database
is up, a press is only remembered, and handed to uvicorn the moment it listens
for signals itself; uvicorn then finishes starting and stops at once, as
after any Ctrl-C, and the command exits 130.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

APP = "keyturn.http.app:create_app"


class _Presses:
    """SIGINT handler that remembers, never raises."""

    def __init__(self) -> None:
        self.pressed = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        self.pressed = True


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, presses: _Presses) -> None:
        super().__init__(config)
        self._presses = presses
        self.pressed_while_starting = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            if self._presses.pressed:
                self.pressed_while_starting = True
                self.handle_exit(signal.SIGINT, None)
            yield


def run(*, workers: int, **options: Any) -> int:
    """Serve until stopped; the exit code: 0 after a stop, 130 if Ctrl-C came
    before the server listened for it."""
    if workers > 1:
        # The supervisor of several processes imports no application and
        # installs its handlers at once: Python's own handler does there.
        uvicorn.run(APP, factory=True, workers=workers, **options)
        return 0
    presses = _Presses()
    previous = signal.signal(signal.SIGINT, presses)
    try:
        server = _Server(uvicorn.Config(APP, factory=True, **options), presses)
        server.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    if server.pressed_while_starting:
        return 128 + signal.SIGINT
    # As uvicorn.run: a server that never started (its startup failed and
    # said why) is exit 3.
    return 0 if server.started else 3

"""A turn's output as its model produces it.

The model streams pieces of text through :meth:`Output.write`; the turn's
output is their concatenation, in order. :meth:`flush` is called once the
reply is done, before the turn's end is recorded.
"""

from __future__ import annotations


class Output:
    def __init__(self) -> None:
        self._parts: list[str] = []
        self._length = 0

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def length(self) -> int:
        """Characters produced so far."""
        return self._length

    async def write(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._length += len(text)

    async def flush(self) -> None:
        """Everything written so far is recorded."""

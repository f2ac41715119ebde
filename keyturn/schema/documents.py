"""Documents kept parsed and validated, bounded by the text they hold.

A client sends the same few texts again and again (persisted documents
always): one lookup by the text answers both parsing and validation, where
hashing a parsed document to find it again walks its whole tree on every
request. The bound is on the texts' total length as well as their number:
a parsed document takes about a hundred times its text (measured: 5.9 KB of
text, 1,350 tokens, 556 KiB parsed), so a count alone would let distinct
large documents hold the better part of a GiB. A text larger than the whole
budget is parsed and validated each time, never kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from graphql import DocumentNode, GraphQLError, parse

# The most tokens a document may have (graphql-core refuses it past them).
MAX_TOKENS = 2000
# Distinct texts kept, and the characters they may add up to (≈50 MiB parsed).
MAX_DOCUMENTS = 1024
MAX_TEXT_CHARS = 512 * 1024


class _Entry:
    __slots__ = ("document", "validated")

    def __init__(self, document: DocumentNode) -> None:
        self.document = document
        # Validation errors by what the document was validated against.
        self.validated: dict[Hashable, list[GraphQLError]] = {}


class DocumentCache:
    def __init__(
        self, *, max_documents: int = MAX_DOCUMENTS, max_chars: int = MAX_TEXT_CHARS
    ) -> None:
        self.max_documents, self.max_chars = max_documents, max_chars
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._chars = 0

    @property
    def chars(self) -> int:
        return self._chars

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, text: str) -> DocumentNode:
        """``text`` parsed (kept, when it fits); a GraphQLError when it does not parse."""
        entry = self._entries.get(text)
        if entry is not None:
            self._entries.move_to_end(text)
            return entry.document
        document = parse(text, max_tokens=MAX_TOKENS)
        if len(text) <= self.max_chars:
            self._entries[text] = _Entry(document)
            self._chars += len(text)
            while len(self._entries) > self.max_documents or self._chars > self.max_chars:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)
        return document

    def validate(
        self,
        text: str,
        document: DocumentNode,
        against: Hashable,
        run: Callable[[DocumentNode], list[GraphQLError]],
    ) -> list[GraphQLError]:
        """``run(document)``'s errors, kept with ``text``'s entry per ``against``
        (the schema and rules it was validated with)."""
        entry = self._entries.get(text)
        if entry is None or entry.document is not document:
            return run(document)
        found = entry.validated.get(against)
        if found is None:
            found = entry.validated[against] = run(document)
        return found

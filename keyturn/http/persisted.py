"""Persisted documents: a client sends a document's SHA-256 instead of its text.

Apollo's automatic persisted queries (``extensions.persistedQuery``, version 1):
a hash alone answers ``PersistedQueryNotFound`` until the text was sent once
with its hash; the text is then kept in this process's memory, at most
``MAX_DOCUMENTS`` documents and ``MAX_BYTES`` of text, the least recently used
dropped first (a client whose hash was dropped is told ``PersistedQueryNotFound``
and sends the text again, which is the protocol working as designed).

``registered_only`` runs nothing but the documents registered at start (a JSON
file mapping SHA-256 to text): production servers then execute only the
operations their own clients were built with.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import orjson

MAX_DOCUMENTS = 1000
MAX_BYTES = 8 * 1024 * 1024

_SHA256 = re.compile(r"[0-9a-f]{64}")

Mode = Literal["auto", "registered_only"]


class PersistedDocumentError(Exception):
    """Refused before anything runs; ``code`` (and for a missing hash the
    message) is what Apollo's persisted query link looks for."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _not_found() -> PersistedDocumentError:
    return PersistedDocumentError(404, "PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")


def _not_registered() -> PersistedDocumentError:
    return PersistedDocumentError(
        400,
        "PERSISTED_QUERY_NOT_IN_LIST",
        "this server runs only registered documents and this one is not registered",
    )


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class PersistedDocuments:
    def __init__(self, mode: Mode = "auto", registered: dict[str, str] | None = None) -> None:
        self.mode = mode
        # Registered documents are never evicted; learned ones are, LRU.
        self._registered = dict(registered or {})
        self._learned: OrderedDict[str, str] = OrderedDict()
        self._learned_bytes = 0

    @classmethod
    def from_file(cls, mode: Mode, path: Path | None) -> PersistedDocuments:
        if path is None:
            return cls(mode)
        try:
            raw: Any = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as error:
            raise ValueError(f"persisted documents file {path}: {error}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"persisted documents file {path}: expected an object sha256 → text")
        registered: dict[str, str] = {}
        for key, text in raw.items():
            if not isinstance(text, str) or sha256(text) != key.lower():
                raise ValueError(
                    f"persisted documents file {path}: the entry {key[:16]}… is not the "
                    "SHA-256 of its text"
                )
            registered[key.lower()] = text
        return cls(mode, registered)

    def __len__(self) -> int:
        return len(self._registered) + len(self._learned)

    def resolve(self, query: str | None, extensions: dict[str, Any] | None) -> str | None:
        """The document to run: ``query``, or the text the hash names.

        Raises :class:`PersistedDocumentError` for a hash not known, a hash that
        is not the text's, or (``registered_only``) any unregistered document.
        """
        persisted = (extensions or {}).get("persistedQuery")
        if persisted is None:
            if self.mode == "registered_only" and not self._known_text(query):
                raise _not_registered()
            return query
        digest = _checked_hash(persisted)
        if query is None:
            known = self._lookup(digest)
            if known is None:
                raise _not_registered() if self.mode == "registered_only" else _not_found()
            return known
        if sha256(query) != digest:
            raise PersistedDocumentError(
                400, "PERSISTED_QUERY_HASH_MISMATCH", "provided sha256Hash does not match query"
            )
        if self._lookup(digest) is None:
            if self.mode == "registered_only":
                raise _not_registered()
            self._learn(digest, query)
        return query

    def _known_text(self, query: str | None) -> bool:
        # An operation sent as plain text runs in registered_only mode when its
        # text is registered (clients that do not send hashes still work).
        return query is not None and self._lookup(sha256(query)) is not None

    def _lookup(self, digest: str) -> str | None:
        found = self._registered.get(digest)
        if found is not None:
            return found
        found = self._learned.get(digest)
        if found is not None:
            self._learned.move_to_end(digest)
        return found

    def _learn(self, digest: str, text: str) -> None:
        size = len(text.encode())
        if size > MAX_BYTES:
            return
        self._learned[digest] = text
        self._learned_bytes += size
        while len(self._learned) > MAX_DOCUMENTS or self._learned_bytes > MAX_BYTES:
            _, dropped = self._learned.popitem(last=False)
            self._learned_bytes -= len(dropped.encode())


def _checked_hash(persisted: object) -> str:
    if not isinstance(persisted, dict) or persisted.get("version") != 1:
        raise PersistedDocumentError(
            400,
            "PERSISTED_QUERY_NOT_SUPPORTED",
            "extensions.persistedQuery must be {version: 1, sha256Hash: HEX}",
        )
    digest = persisted.get("sha256Hash")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
        raise PersistedDocumentError(
            400, "BAD_REQUEST", "extensions.persistedQuery.sha256Hash must be 64 hexadecimal digits"
        )
    return digest.lower()

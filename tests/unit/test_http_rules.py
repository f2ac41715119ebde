"""Persisted documents (bounded, verified) and media type negotiation."""

from __future__ import annotations

import hashlib

import pytest

from keyturn.http import persisted
from keyturn.http.media import GRAPHQL_RESPONSE, JSON, response_media_type
from keyturn.http.persisted import PersistedDocumentError, PersistedDocuments


def ext(text: str) -> dict[str, object]:
    return {
        "persistedQuery": {"version": 1, "sha256Hash": hashlib.sha256(text.encode()).hexdigest()}
    }


def test_learned_documents_are_bounded_least_recently_used_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(persisted, "MAX_DOCUMENTS", 2)
    store = PersistedDocuments()
    a, b, c = "{ a }", "{ b }", "{ c }"
    for text in (a, b):
        assert store.resolve(text, ext(text)) == text
    assert store.resolve(None, ext(a)) == a  # a is now the most recent
    store.resolve(c, ext(c))
    assert len(store) == 2
    assert store.resolve(None, ext(a)) == a
    with pytest.raises(PersistedDocumentError) as missing:
        store.resolve(None, ext(b))
    assert missing.value.message == "PersistedQueryNotFound" and missing.value.status == 404


def test_a_hash_that_is_not_the_texts_is_refused_and_not_stored() -> None:
    store = PersistedDocuments()
    with pytest.raises(PersistedDocumentError) as mismatch:
        store.resolve("{ a }", ext("{ b }"))
    assert mismatch.value.status == 400
    assert len(store) == 0


def test_registered_documents_are_never_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(persisted, "MAX_DOCUMENTS", 1)
    text = "{ kept }"
    store = PersistedDocuments("auto", {hashlib.sha256(text.encode()).hexdigest(): text})
    for other in ("{ x }", "{ y }"):
        store.resolve(other, ext(other))
    assert store.resolve(None, ext(text)) == text


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, JSON),
        ("*/*", JSON),
        ("application/json", JSON),
        ("application/graphql-response+json, application/json", GRAPHQL_RESPONSE),
        ("application/graphql-response+json,application/json;q=0.9", GRAPHQL_RESPONSE),
        ("application/json, application/graphql-response+json", JSON),
        ("application/graphql-response+json;q=0.2, application/json;q=0.8", JSON),
        ("application/graphql-response+json;q=0", JSON),
        ("text/html", JSON),
    ],
)
def test_media_type_negotiation(accept: str | None, expected: str) -> None:
    assert response_media_type(accept) == expected

"""The parsed-document cache stays within its bound of text, whatever texts arrive."""

from __future__ import annotations

from collections.abc import Callable

from graphql import DocumentNode, GraphQLError

from keyturn.schema.documents import DocumentCache


def doc(n: int, width: int = 0) -> str:
    padding = " " * width
    return f"{{ a{n}: __typename {padding}}}"


def test_distinct_large_documents_never_hold_more_than_the_bound_of_text() -> None:
    cache = DocumentCache(max_documents=1000, max_chars=10_000)
    for n in range(500):
        cache.parse(doc(n, width=900))  # ~920 characters each
        assert cache.chars <= 10_000
    assert 0 < len(cache) <= 10


def test_a_text_larger_than_the_whole_bound_is_parsed_but_not_kept() -> None:
    cache = DocumentCache(max_chars=100)
    small = doc(1)
    cache.parse(small)
    big = doc(2, width=200)
    assert cache.parse(big) is not cache.parse(big)  # parsed again each time
    assert len(cache) == 1 and cache.parse(small) is cache.parse(small)


def test_the_count_bound_keeps_the_most_recently_used() -> None:
    cache = DocumentCache(max_documents=3)
    first = cache.parse(doc(0))
    for n in (1, 2):
        cache.parse(doc(n))
    assert cache.parse(doc(0)) is first  # used again: now the newest
    cache.parse(doc(3))  # evicts doc(1), the oldest
    assert len(cache) == 3
    assert cache.parse(doc(0)) is first


def test_validation_is_kept_per_schema_and_rules_with_its_document() -> None:
    cache = DocumentCache()
    text = doc(0)
    document = cache.parse(text)
    runs: list[str] = []

    def validator(against: str) -> Callable[[DocumentNode], list[GraphQLError]]:
        def run(_document: DocumentNode) -> list[GraphQLError]:
            runs.append(against)
            return []

        return run

    for against in ("a", "a", "b", "a"):
        cache.validate(text, document, against, validator(against))
    assert runs == ["a", "b"]

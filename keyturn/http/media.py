"""Media types of GraphQL over HTTP (the graphql-over-http draft).

``application/graphql-response+json`` when the client's Accept prefers it
(Apollo Client 4, graphql-request, urql and graphql-http send it first): then
a request that never reached execution (it does not parse, validate, or its
variables do not coerce) is a 4xx without a ``data`` entry. Otherwise
``application/json``, always 200 once the request is well formed, as legacy
clients expect.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs

GRAPHQL_RESPONSE = "application/graphql-response+json"
JSON = "application/json"


def _accepted(accept: str) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media:
            out.append((media.lower(), q))
    return out


def response_media_type(accept: str | None) -> str:
    """The higher of the two by q (the first listed on a tie); application/json
    when Accept names neither or is absent (the draft's advice for now)."""
    best, best_q = JSON, -1.0
    for media, q in _accepted(accept or ""):
        if media in (GRAPHQL_RESPONSE, JSON) and q > 0 and q > best_q:
            best, best_q = media, q
    return best


def is_ide_request(method: str, params: Mapping[str, object], accept: str) -> bool:
    """A browser asking for GraphiQL: GET with neither a document nor a hash,
    accepting HTML. ``curl URL?query=…`` (Accept */*) is a query, not a page."""
    return (
        method == "GET"
        and params.get("query") is None
        and params.get("extensions") is None
        and any(kind in accept for kind in ("text/html", "*/*"))
    )


def query_params(query_string: bytes) -> dict[str, list[str]]:
    return parse_qs(query_string.decode("latin-1"))

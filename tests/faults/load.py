"""A client that keeps submitting through faults, as a careful client would:
a retryable error means "send the same key again"; anything else is a bug."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support import MUTATION_SUBMIT


class UnexpectedAnswer(AssertionError):
    pass


@dataclass
class Load:
    base_url: str
    session_id: str
    acked: dict[str, str] = field(default_factory=dict)  # key -> turn id
    answers: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    last_ack: float = 0.0
    text: str = "t"
    pace_s: float = 0.0  # pause between one key's acknowledgement and the next key
    error_times: list[float] = field(default_factory=list)

    async def submit_once(
        self, http: httpx.AsyncClient, key: str, text: str
    ) -> dict[str, Any] | None:
        """The admission, or None for a retryable failure."""
        variables = {"input": {"sessionId": self.session_id, "idempotencyKey": key, "input": text}}
        try:
            response = await http.post(
                "/graphql", json={"query": MUTATION_SUBMIT, "variables": variables}
            )
        except httpx.TransportError:
            self.answers["transport error"] += 1
            return None
        if response.status_code == 503:
            # Refused before GraphQL (the token check could not reach the
            # database): a retryable answer at the HTTP level.
            code = response.json()["errors"][0]["extensions"]["code"]
            assert code == "UNAVAILABLE", response.text
            self.answers["HTTP 503 UNAVAILABLE"] += 1
            self.error_times.append(time.monotonic())
            return None
        if response.status_code != 200:
            raise UnexpectedAnswer(f"HTTP {response.status_code}: {response.text}")
        body = response.json()
        if body.get("errors"):
            ext = body["errors"][0].get("extensions") or {}
            if not ext.get("retryable"):
                raise UnexpectedAnswer(f"non-retryable error: {body['errors']}")
            self.answers[f"error {ext.get('code')}"] += 1
            self.error_times.append(time.monotonic())
            return None
        result: dict[str, Any] = body["data"]["submitTurn"]
        self.answers[result["__typename"]] += 1
        if result["__typename"] not in ("TurnAccepted", "TurnReplayed"):
            raise UnexpectedAnswer(f"not an admission: {result}")
        return result

    async def submit_until_acknowledged(self, http: httpx.AsyncClient, key: str, text: str) -> str:
        first_turn: str | None = None
        while True:
            result = await self.submit_once(http, key, text)
            if result is not None:
                turn_id = str(result["turn"]["id"])
                if first_turn is not None:
                    assert turn_id == first_turn
                self.acked[key] = turn_id
                self.last_ack = time.monotonic()
                return turn_id
            self.retries += 1
            await asyncio.sleep(0.05)

    async def worker(self, n: int) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as http:
            i = 0
            while not self.stop.is_set():
                i += 1
                key = f"w{n}-{i}-{uuid.uuid4().hex[:6]}"
                await self.submit_until_acknowledged(http, key, f"{self.text} {n}.{i}")
                if self.pace_s:
                    await asyncio.sleep(self.pace_s)

    async def acks_after(self, moment: float, count: int, within: float = 30) -> None:
        """Wait until ``count`` submissions were acknowledged after ``moment``."""
        deadline = time.monotonic() + within
        seen = len(self.acked)
        while len(self.acked) < seen + count or self.last_ack < moment:
            if time.monotonic() > deadline:
                raise AssertionError(f"no progress after the fault: {self.answers}")
            await asyncio.sleep(0.05)

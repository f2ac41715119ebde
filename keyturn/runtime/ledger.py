"""The tool ledger: run a turn's tool calls with a record on each side, and
say afterwards what the record can establish.

For every call the runtime commits ``tool.intent`` (tool, arguments, kind and
an effect key derived from the turn id and the call's index) before the tool
runs, and ``tool.result`` after it returns. An intent without a result is an
outcome nobody knows: the process may have stopped before the tool ran, while
it ran, or after. Once such a turn is INTERRUPTED, IDEMPOTENT tools are asked
about the effect key and the answer is saved as ``tool.reconciled``; for the
others the record keeps saying OUTCOME_UNKNOWN, and a person decides.

A retry (``turn.retry_of``) reuses what the interrupted turn established:

=========================================  ========================================
the interrupted turn's call                the retry's call with the same index
=========================================  ========================================
COMPLETED, RECONCILED_APPLIED              reused: ``tool.result`` with ``reused``
IDEMPOTENT, OUTCOME_UNKNOWN                run again with the *same* effect key
                                           (the tool applies a key at most once)
RECONCILED_NOT_APPLIED                     run again under the retry's own key
                                           (asking settled the old key as never)
UNSAFE, OUTCOME_UNKNOWN                    run again only when the retry was
                                           forced (the resolution refuses otherwise)
READ_ONLY unknown, NOT_STARTED, no record  run as any new call
=========================================  ========================================
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from keyturn.db import ledger as db
from keyturn.db import reads, work
from keyturn.db.engine import connect
from keyturn.db.rows import EventRecord
from keyturn.db.tables import Turn
from keyturn.errors import DatabaseUnavailable, KeyturnError, StaleLease
from keyturn.runtime.bus import EventBus
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.model import Model, ModelError, PastTurn, ToolOutcome, ToolRequest
from keyturn.runtime.tools import ToolError, ToolKind, Tools

log = logging.getLogger("keyturn.ledger")

MAX_TOOL_CALLS = 64


class ToolCallState(StrEnum):
    NOT_STARTED = "NOT_STARTED"  # planned, no intent recorded
    COMPLETED = "COMPLETED"  # intent and result
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # intent without result
    RECONCILED_APPLIED = "RECONCILED_APPLIED"
    RECONCILED_NOT_APPLIED = "RECONCILED_NOT_APPLIED"


class ToolOutcomeUnknown(KeyturnError):
    """A tool failed in a way that leaves its effect unknown; the turn is left
    to be interrupted and reconciled, not finished."""


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """One call of a turn, as its ledger events establish it."""

    index: int
    tool: str
    arguments: dict[str, Any]
    effect_key: str
    kind: ToolKind
    state: ToolCallState
    result: dict[str, Any] | None = None
    reused_from: str | None = None  # the turn whose result this call reused


def effect_key(turn_id: uuid.UUID, index: int) -> str:
    """Stable across restarts: the same turn's call i always has this key."""
    return f"{turn_id}/{index}"


def tool_calls(events: Sequence[EventRecord]) -> list[ToolCallView]:
    """The calls a turn's events establish, by index."""
    calls: dict[int, ToolCallView] = {}

    def view(d: dict[str, Any], state: ToolCallState, **extra: Any) -> ToolCallView:
        before = calls.get(int(d["index"]))
        return ToolCallView(
            index=int(d["index"]),
            tool=str(d.get("tool", before.tool if before else "")),
            arguments=dict(d.get("arguments", before.arguments if before else {})),
            effect_key=str(d.get("effectKey", before.effect_key if before else "")),
            kind=ToolKind(d.get("kind", before.kind if before else ToolKind.UNSAFE)),
            state=state,
            **extra,
        )

    for event in sorted(events, key=lambda e: e.seq):
        d = event.data
        if event.type == "tool.planned":
            for planned in d.get("calls", []):
                if int(planned["index"]) not in calls:
                    calls[int(planned["index"])] = view(planned, ToolCallState.NOT_STARTED)
        elif event.type == "tool.intent":
            calls[int(d["index"])] = view(d, ToolCallState.OUTCOME_UNKNOWN)
        elif event.type == "tool.result":
            calls[int(d["index"])] = view(
                d,
                ToolCallState.COMPLETED,
                result=d.get("result"),
                reused_from=d.get("reusedFrom"),
            )
        elif event.type == "tool.reconciled":
            state = (
                ToolCallState.RECONCILED_APPLIED
                if d.get("applied")
                else ToolCallState.RECONCILED_NOT_APPLIED
            )
            calls[int(d["index"])] = view(d, state)
    return [calls[i] for i in sorted(calls)]


@dataclass(frozen=True, slots=True)
class _Plan:
    index: int
    request: ToolRequest
    kind: ToolKind
    effect_key: str
    reuse: ToolCallView | None  # reuse this earlier call's result instead of running
    previous: ToolCallView | None  # the interrupted turn's call with this index

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tool": self.request.tool,
            "arguments": self.request.arguments,
            "kind": self.kind.value,
            "effectKey": self.effect_key,
        }


class ToolRunner:
    """Runs one turn's model with its tool calls, writing the ledger."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        model: Model,
        bus: EventBus,
        tools: Tools,
        crash: CrashHook,
        lease_ttl_s: float,
        owner: str,
    ) -> None:
        self.engine = engine
        self.model = model
        self.bus = bus
        self.tools = tools
        self.crash = crash
        self.lease_ttl_s = lease_ttl_s
        self.owner = owner

    # -- running -----------------------------------------------------------
    async def produce(self, turn: Turn, past: list[PastTurn]) -> str:
        previous = await self._previous_calls(turn)
        results: list[ToolOutcome] = []
        while True:
            requests = await self.model.tool_calls(input=turn.input, history=past, results=results)
            if not requests:
                break
            if len(results) + len(requests) > MAX_TOOL_CALLS:
                raise ModelError(f"the model asked for more than {MAX_TOOL_CALLS} tool calls")
            plans = [
                self._plan(turn, len(results) + n, request, previous)
                for n, request in enumerate(requests)
            ]
            await self._append(turn, "tool.planned", {"calls": [p.describe() for p in plans]})
            for plan in plans:
                results.append(await self._call(turn, plan))
        return await self.model.reply(input=turn.input, history=past, results=results)

    async def _previous_calls(self, turn: Turn) -> dict[int, ToolCallView]:
        if turn.retry_of is None:
            return {}
        async with connect(self.engine) as conn:
            events = await reads.turn_events(conn, turn_id=turn.retry_of)
        return {c.index: c for c in tool_calls(events)}

    def _plan(
        self, turn: Turn, index: int, request: ToolRequest, previous: dict[int, ToolCallView]
    ) -> _Plan:
        kind = self.tools.kind_of(request.tool)
        before = previous.get(index)
        if before is not None and (before.tool, before.arguments) != (
            request.tool,
            request.arguments,
        ):
            before = None  # a different call at that index: nothing to reuse
        own_key = effect_key(turn.id, index)
        if before is None:
            return _Plan(index, request, kind, own_key, None, None)
        if before.state in (ToolCallState.COMPLETED, ToolCallState.RECONCILED_APPLIED):
            return _Plan(index, request, kind, before.effect_key, before, before)
        if before.state is ToolCallState.OUTCOME_UNKNOWN and kind is ToolKind.IDEMPOTENT:
            return _Plan(index, request, kind, before.effect_key, None, before)
        return _Plan(index, request, kind, own_key, None, before)

    async def _call(self, turn: Turn, plan: _Plan) -> ToolOutcome:
        data = plan.describe()
        if plan.reuse is not None:
            reused = plan.reuse
            kept = (
                reused.result
                if reused.result is not None
                else {"applied": True, "reconciled": True}
            )
            await self._append(
                turn,
                "tool.result",
                {
                    **data,
                    "result": kept,
                    "reused": True,
                    "reusedFrom": reused.reused_from or str(turn.retry_of),
                    "epoch": turn.epoch,
                },
            )
            return ToolOutcome(plan.index, plan.request.tool, plan.request.arguments, kept)

        tool = self.tools.get(plan.request.tool)
        await self.crash.point("before_intent", plan.index)
        intent = {**data, "epoch": turn.epoch}
        if plan.previous is not None:
            intent["previous"] = {
                "turnId": str(turn.retry_of),
                "effectKey": plan.previous.effect_key,
                "state": plan.previous.state.value,
            }
        await self._append(turn, "tool.intent", intent)
        await self.crash.point("after_intent", plan.index)
        if tool is None:
            result: dict[str, Any] = {"error": f"no tool named {plan.request.tool!r}"}
        else:
            try:
                result = await tool.run(plan.request.arguments, effect_key=plan.effect_key)
            except ToolError as error:
                result = {"error": str(error)}
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.exception("turn %s: tool %s failed", turn.id, plan.request.tool)
                raise ToolOutcomeUnknown() from error
        await self.crash.point("after_write", plan.index)
        await self._append(turn, "tool.result", {**data, "result": result, "epoch": turn.epoch})
        await self.crash.point("after_result", plan.index)
        return ToolOutcome(plan.index, plan.request.tool, plan.request.arguments, result)

    async def _append(self, turn: Turn, type: str, data: dict[str, Any]) -> None:
        # A lost connection is retried for as long as the lease could hold;
        # the unique index on the ledger makes a repeat harmless.
        deadline = asyncio.get_running_loop().time() + self.lease_ttl_s
        while True:
            try:
                async with connect(self.engine) as conn:
                    done = await db.append(
                        conn, turn_id=turn.id, epoch=turn.epoch, type=type, data=data
                    )
                    if done is db.Appended.REFUSED:
                        await work.record_refused_write(
                            conn, turn_id=turn.id, epoch=turn.epoch, attempted=type, by=self.owner
                        )
                break
            except DatabaseUnavailable:
                if asyncio.get_running_loop().time() > deadline:
                    raise ToolOutcomeUnknown() from None
                await asyncio.sleep(0.5)
        self.bus.committed(turn.session_id)
        if done is db.Appended.REFUSED:
            raise StaleLease()

    # -- settling ------------------------------------------------------------
    async def reconcile(self, turn_id: uuid.UUID) -> int:
        """Ask IDEMPOTENT tools about every call of an INTERRUPTED turn whose
        outcome is unknown; save each answer as ``tool.reconciled``."""
        async with connect(self.engine) as conn:
            events = await reads.turn_events(conn, turn_id=turn_id)
        saved = 0
        for call in tool_calls(events):
            if call.state is not ToolCallState.OUTCOME_UNKNOWN or call.kind is not (
                ToolKind.IDEMPOTENT
            ):
                continue
            tool = self.tools.get(call.tool)
            if tool is None or tool.kind is not ToolKind.IDEMPOTENT:
                continue
            try:
                applied = await tool.applied(call.effect_key)
            except Exception:
                log.exception(
                    "turn %s: could not ask %s about %s", turn_id, call.tool, call.effect_key
                )
                continue
            async with connect(self.engine) as conn:
                done = await db.append_reconciled(
                    conn,
                    turn_id=turn_id,
                    data={
                        "index": call.index,
                        "tool": call.tool,
                        "effectKey": call.effect_key,
                        "applied": applied,
                        "by": self.owner,
                    },
                )
            if done is db.Appended.APPENDED:
                saved += 1
                self.bus.committed(events[0].session_id)
        return saved

    async def catch_up(self) -> int:
        """Settle interrupted turns a stopped process left unsettled."""
        async with connect(self.engine) as conn:
            turn_ids = await db.unsettled_turns(conn)
        return sum([await self.reconcile(t) for t in turn_ids])

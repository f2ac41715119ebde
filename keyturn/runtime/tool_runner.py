"""Running a turn's model with its tool calls, writing the tool ledger on each
side of every call.

A retry (``turn.retry_of``) reuses what the interrupted turn established:

=========================================  ========================================
the interrupted turn's call                the retry's call with the same index
=========================================  ========================================
COMPLETED, RECONCILED_APPLIED              reused: ``tool.result`` with ``reused``
IDEMPOTENT, OUTCOME_UNKNOWN                asked first (as reconciliation asks, and
                                           recorded as ``tool.reconciled``), then
                                           reused or run under the retry's own key;
                                           only a tool that cannot tell runs the
                                           *same* key again (it applies it once)
RECONCILED_NOT_APPLIED                     run again under the retry's own key
                                           (asking settled the old key as never)
UNSAFE, OUTCOME_UNKNOWN                    run again only when the retry was
                                           forced (the resolution refuses otherwise)
READ_ONLY or REPEATABLE, OUTCOME_UNKNOWN   run again under the retry's own key, no
                                           force needed (a repeat adds no effect)
NOT_STARTED, no record                     run as any new call
=========================================  ========================================

Each call may take ``tool_timeout_s`` (KEYTURN_TOOL_TIMEOUT_S). Past it a
READ_ONLY call is recorded as an error result and the turn goes on; for any
other kind the effect is unknown (the tool may still be at work), so the call
stays OUTCOME_UNKNOWN and the turn is left to be interrupted, as when the
process dies between intent and result.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from keyturn.db import leases, reads
from keyturn.db import ledger as db
from keyturn.db.engine import Engine, connect
from keyturn.db.records import TurnRecord
from keyturn.domain import EventType, ToolCallState, ToolKind
from keyturn.errors import (
    DatabaseUnavailable,
    ModelError,
    StaleLease,
    ToolError,
    ToolOutcomeUnknown,
)
from keyturn.runtime.bus import EventBus
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.ledger import ToolCallView, effect_key, tool_calls
from keyturn.runtime.model import Model, PastTurn, Round, ToolOutcome, ToolRequest
from keyturn.runtime.output import Output
from keyturn.runtime.tools import Tools

log = logging.getLogger(__name__)

# Calls in one turn, across all its rounds: a bound on what one turn can do
# whatever KEYTURN_MAX_TOOL_ROUNDS allows.
MAX_TOOL_CALLS = 64
DEFAULT_MAX_TOOL_ROUNDS = 8
# How long one question to a tool about an unknown outcome may take; a store
# that does not answer in time is asked again later.
RECONCILE_QUESTION_TIMEOUT_S = 10.0
# A retry asks about the interrupted turn's unknown outcomes this many times,
# a growing pause apart, before it gives up (and is left to its lease).
_SETTLE_ATTEMPTS = 4
_SETTLE_RETRY_S = 0.5
DEFAULT_TOOL_TIMEOUT_S = 30.0


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
            "kind": self.kind,
            "effectKey": self.effect_key,
        }


class ToolRunner:
    """Runs one turn's model with its tool calls, writing the ledger."""

    def __init__(
        self,
        *,
        engine: Engine,
        model: Model,
        bus: EventBus,
        tools: Tools,
        crash: CrashHook,
        lease_ttl_s: float,
        owner: str,
        question_timeout_s: float = RECONCILE_QUESTION_TIMEOUT_S,
        max_rounds: int = DEFAULT_MAX_TOOL_ROUNDS,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        self.tool_timeout_s = tool_timeout_s
        self.max_rounds = max_rounds
        self.engine = engine
        self.model = model
        self.bus = bus
        self.tools = tools
        self.crash = crash
        self.lease_ttl_s = lease_ttl_s
        self.owner = owner
        self.question_timeout_s = question_timeout_s

    # -- running -----------------------------------------------------------
    async def produce(self, turn: TurnRecord, past: list[PastTurn], output: Output) -> str:
        """Run the model round by round, its text into ``output`` and its
        calls through the ledger; the turn's output once the reply is done."""
        previous = await self._previous_calls(turn)
        rounds: list[Round] = []
        offered = self.tools.specs()
        made = 0
        while True:
            start = output.length
            requests = await self.model.step(
                input=turn.input,
                mode=turn.history,
                history=past,
                rounds=rounds,
                tools=offered,
                emit=output.write,
            )
            if not requests:
                break
            if len(rounds) >= self.max_rounds:
                raise ModelError(
                    f"the model was still asking for tools after {self.max_rounds} rounds"
                    " (KEYTURN_MAX_TOOL_ROUNDS)"
                )
            if made + len(requests) > MAX_TOOL_CALLS:
                raise ModelError(f"the model asked for more than {MAX_TOOL_CALLS} tool calls")
            plans = [
                self._plan(turn, made + n, request, previous) for n, request in enumerate(requests)
            ]
            # Keyed by its first call's index and the epoch (the ledger's
            # unique index), so a retried append cannot plan twice.
            planned = {
                "index": made,
                "epoch": turn.epoch,
                "calls": [p.describe() for p in plans],
            }
            await self._append(turn, EventType.TOOL_PLANNED, planned)
            outcomes = [await self._call(turn, plan) for plan in plans]
            made += len(outcomes)
            rounds.append(Round(output.text[start:], tuple(outcomes)))
        await output.flush()
        return output.text

    async def _previous_calls(self, turn: TurnRecord) -> dict[int, ToolCallView]:
        """The interrupted turn's calls, a retry's to reuse, with every unknown
        outcome of an IDEMPOTENT tool settled first.

        Settling comes before planning: a retry that ran under the old key
        while another process was asking about it could have its write
        refused by that very question ("never applied"). Asking is final and
        the answer is recorded once (the ledger's unique index), so whoever
        asks first, the reconciler or this retry, both see the same answer;
        the retry then reuses an applied effect or runs under its own key."""
        if turn.retry_of is None:
            return {}
        for attempt in range(_SETTLE_ATTEMPTS):
            calls = await self._calls_of(turn.retry_of)
            if not any(self._askable(c) for c in calls.values()):
                return calls
            if attempt:
                await asyncio.sleep(_SETTLE_RETRY_S * attempt)
            if await self.reconcile(turn.retry_of) == 0:
                # Every question answered (or a tool said it cannot tell:
                # then the old key runs again, which such a tool allows).
                return await self._calls_of(turn.retry_of)
        raise ToolOutcomeUnknown("the earlier turn's unknown tool outcomes could not be settled")

    async def _calls_of(self, turn_id: uuid.UUID) -> dict[int, ToolCallView]:
        async with connect(self.engine) as conn:
            events = await reads.turn_events(conn, turn_id=turn_id)
        return {c.index: c for c in tool_calls(events)}

    def _askable(self, call: ToolCallView) -> bool:
        """An unknown outcome an IDEMPOTENT tool can be asked about."""
        if call.state is not ToolCallState.OUTCOME_UNKNOWN or call.kind is not ToolKind.IDEMPOTENT:
            return False
        tool = self.tools.get(call.tool)
        return tool is not None and tool.kind is ToolKind.IDEMPOTENT

    def _plan(
        self, turn: TurnRecord, index: int, request: ToolRequest, previous: dict[int, ToolCallView]
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

    async def _call(self, turn: TurnRecord, plan: _Plan) -> ToolOutcome:
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
                EventType.TOOL_RESULT,
                {
                    **data,
                    "result": kept,
                    "reused": True,
                    "reusedFrom": reused.reused_from or str(turn.retry_of),
                    "epoch": turn.epoch,
                },
            )
            return ToolOutcome(
                plan.index, plan.request.tool, plan.request.arguments, kept, plan.request.call_id
            )

        tool = self.tools.get(plan.request.tool)
        await self.crash.point("before_intent", plan.index)
        intent = {**data, "epoch": turn.epoch}
        if plan.previous is not None:
            intent["previous"] = {
                "turnId": str(turn.retry_of),
                "effectKey": plan.previous.effect_key,
                "state": plan.previous.state,
            }
        await self._append(turn, EventType.TOOL_INTENT, intent)
        await self.crash.point("after_intent", plan.index)
        if tool is None:
            result: dict[str, Any] = {"error": f"no tool named {plan.request.tool!r}"}
        else:
            try:
                result = await asyncio.wait_for(
                    tool.run(plan.request.arguments, effect_key=plan.effect_key),
                    self.tool_timeout_s,
                )
            except ToolError as error:
                result = {"error": str(error)}
            except TimeoutError:
                late = f"{plan.request.tool} did not answer within {self.tool_timeout_s:g}s"
                if plan.kind is not ToolKind.READ_ONLY:
                    raise ToolOutcomeUnknown(f"{late}; its effect is unknown") from None
                result = {"error": f"{late} (KEYTURN_TOOL_TIMEOUT_S)"}
            except ToolOutcomeUnknown:
                raise
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.exception("turn %s: tool %s failed", turn.id, plan.request.tool)
                raise ToolOutcomeUnknown() from error
        await self.crash.point("after_write", plan.index)
        await self._append(
            turn, EventType.TOOL_RESULT, {**data, "result": result, "epoch": turn.epoch}
        )
        await self.crash.point("after_result", plan.index)
        return ToolOutcome(
            plan.index, plan.request.tool, plan.request.arguments, result, plan.request.call_id
        )

    async def _append(self, turn: TurnRecord, type: EventType, data: dict[str, Any]) -> None:
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
                        await leases.record_refused_write(
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
        outcome is unknown; save each answer as ``tool.reconciled``. Returns
        how many questions went unanswered (worth asking again)."""
        async with connect(self.engine) as conn:
            events = await reads.turn_events(conn, turn_id=turn_id)
        unanswered = 0
        for call in tool_calls(events):
            if call.state is not ToolCallState.OUTCOME_UNKNOWN or call.kind is not (
                ToolKind.IDEMPOTENT
            ):
                continue
            tool = self.tools.get(call.tool)
            if tool is None or tool.kind is not ToolKind.IDEMPOTENT:
                continue
            try:
                applied = await asyncio.wait_for(
                    tool.applied(call.effect_key), self.question_timeout_s
                )
            except ToolError as error:
                # The tool says it cannot tell: asking again would not help.
                log.warning(
                    "turn %s: %s cannot settle %s: %s", turn_id, call.tool, call.effect_key, error
                )
                continue
            except Exception:
                log.warning(
                    "turn %s: could not ask %s about %s; will ask again",
                    turn_id,
                    call.tool,
                    call.effect_key,
                    exc_info=True,
                )
                unanswered += 1
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
                self.bus.committed(events[0].session_id)
        return unanswered

    async def unsettled(self) -> list[uuid.UUID]:
        """Interrupted turns a stopped process left unsettled."""
        async with connect(self.engine) as conn:
            return await db.unsettled_turns(conn)

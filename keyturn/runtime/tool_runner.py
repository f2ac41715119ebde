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

A call that needs approval (:mod:`keyturn.runtime.approval`) is recorded as
``tool.approval_requested`` before any intent, and the turn stops, WAITING.
Once decided, the turn is claimed again and resumed from its record: the
rounds already planned are not asked of the model again; their recorded
results and refusals are its outcomes, and the round that waited goes on
with the decided call (run when approved, its refusal when rejected).

Each call may take ``tool_timeout_s`` (KEYTURN_TOOL_TIMEOUT_S). A call that
was sent and not answered (past that time, its server gone mid-call, or an
exception from the tool that is not a ToolError) is a tool error like any
other: its ``tool.result`` is what the model is shown, and the turn goes on.
What the result says of the effect depends on the kind:

============================  ==============================================
the call that got no answer   its ``tool.result``, and the call's state
============================  ==============================================
READ_ONLY                     ``{"error": TEXT}``, COMPLETED: a read did
                              nothing
IDEMPOTENT, asked at once     ``{"applied": true, "reconciled": true,
(``applied`` of its key,      "note": TEXT}``, RECONCILED_APPLIED, or
within the same time)         ``{"error": TEXT, "applied": false}``,
                              RECONCILED_NOT_APPLIED (the answer is final:
                              the key never applies later)
REPEATABLE, UNSAFE, or an     ``{"error": "TEXT; whether it acted is
IDEMPOTENT one that could     unknown", "outcomeUnknown": true}``,
not answer                    OUTCOME_UNKNOWN (the tool may still be at
                              work); the event's data is flagged too
============================  ==============================================

The model decides what to do with it. If the turn is interrupted later, its
unknown calls are settled and retried as the first table says, whichever way
they came to be unknown (an IDEMPOTENT one is asked again; an UNSAFE one
refuses a retry without force). A turn that ended otherwise keeps what it
recorded: nobody retries it. Only a record that cannot be written (the
fenced append failing past the lease) leaves the turn to be interrupted
(ToolOutcomeUnknown), as when the process dies between intent and result.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from keyturn.db import approvals, leases, reads
from keyturn.db import ledger as db
from keyturn.db.engine import Conn, Engine, connect
from keyturn.db.records import EventRecord, TurnRecord
from keyturn.domain import EventType, ToolCallState, ToolKind, TurnStatus
from keyturn.errors import (
    AwaitingApproval,
    CancelRequested,
    DatabaseUnavailable,
    EffectRefused,
    ModelError,
    StaleLease,
    ToolError,
    ToolOutcomeUnknown,
    ToolServerDied,
)
from keyturn.runtime.approval import ApprovalPolicy, Decided, ToolCallDecision, decisions, refusal
from keyturn.runtime.bus import EventBus
from keyturn.runtime.cancel import CancelSignal
from keyturn.runtime.crash import CrashHook
from keyturn.runtime.fenced import append_fenced
from keyturn.runtime.ledger import (
    APPLIED,
    OUTCOME_UNKNOWN,
    RECONCILED,
    ToolCallView,
    effect_key,
    tool_calls,
)
from keyturn.runtime.model import Model, PastTurn, Round, ToolOutcome, ToolRequest
from keyturn.runtime.output import Output
from keyturn.runtime.tools import Tool, Tools
from keyturn.waits import within

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

    def planned(self) -> dict[str, Any]:
        """As ``tool.planned`` holds it: with the model's own name for the
        call, which a resumed turn shows the model again."""
        data = self.describe()
        if self.request.call_id:
            data["callId"] = self.request.call_id
        return data


@dataclass(frozen=True, slots=True)
class _OpenRound:
    """A recorded round whose calls are not all done: the one that waited."""

    first: int  # its first call's index
    requests: tuple[ToolRequest, ...]
    text_start: int  # where its text starts in the output


@dataclass(frozen=True, slots=True)
class _Resumption:
    """What a turn's record establishes when it is claimed after a decision."""

    text: str = ""  # its deltas, concatenated
    deltas: int = 0
    rounds: tuple[Round, ...] = ()
    open: _OpenRound | None = None
    made: int = 0  # calls planned
    known: dict[int, ToolOutcome] | None = None  # done calls' outcomes (results, refusals)
    unknown: frozenset[int] = frozenset()  # calls with an intent and no result
    decided: dict[int, Decided] | None = None


def _resumption(events: list[EventRecord]) -> _Resumption:
    """The rounds a turn's record holds since it last started afresh (a turn
    handed back to the queue starts afresh). Empty unless it asked for approval."""
    events = sorted(events, key=lambda e: e.seq)
    released = [n for n, e in enumerate(events) if e.type == EventType.TURN_RELEASED]
    if released:
        events = events[released[-1] + 1 :]
    if not any(e.type == EventType.TOOL_APPROVAL_REQUESTED for e in events):
        return _Resumption()
    deltas = [e for e in events if e.type == EventType.TURN_DELTA]
    text = "".join(str(e.data.get("text", "")) for e in deltas)
    views = {c.index: c for c in tool_calls(events)}
    known: dict[int, ToolOutcome] = {}
    rounds: list[Round] = []
    open_round: _OpenRound | None = None
    made, text_start = 0, 0
    plans = sorted(
        (e for e in events if e.type == EventType.TOOL_PLANNED),
        key=lambda e: int(e.data["index"]),
    )
    for event in plans:
        first = int(event.data["index"])
        requests = tuple(
            ToolRequest(str(c["tool"]), dict(c.get("arguments", {})), str(c.get("callId", "")))
            for c in event.data.get("calls", [])
        )
        outcomes: list[ToolOutcome] = []
        for n, request in enumerate(requests):
            view = views.get(first + n)
            # A result (an unknown outcome's error included) or a refusal:
            # the model was shown it, and is shown it again.
            if view is None or view.result is None:
                continue
            outcome = ToolOutcome(
                first + n, request.tool, request.arguments, view.result, request.call_id
            )
            known[first + n] = outcome
            outcomes.append(outcome)
        end = int(event.data.get("outputChars", len(text)))
        if len(outcomes) == len(requests) and open_round is None:
            rounds.append(Round(text[text_start:end], tuple(outcomes)))
        elif open_round is None:
            open_round = _OpenRound(first, requests, text_start)
        text_start = end
        made = first + len(requests)
    # Intents without a result: running them again could repeat them.
    unknown = frozenset(
        i for i, v in views.items() if v.state is ToolCallState.OUTCOME_UNKNOWN and v.result is None
    )
    return _Resumption(
        text, len(deltas), tuple(rounds), open_round, made, known, unknown, decisions(events)
    )


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
        approval: ApprovalPolicy | None = None,
    ) -> None:
        self.approval = approval or ApprovalPolicy()
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
        # The cancel signals of the turns running now (the worker keeps them).
        self.cancels: dict[uuid.UUID, CancelSignal] = {}

    # -- running -----------------------------------------------------------
    async def produce(self, turn: TurnRecord, past: list[PastTurn], output: Output) -> str:
        """Run the model round by round, its text into ``output`` and its
        calls through the ledger; the turn's output once the reply is done."""
        previous = await self._previous_calls(turn)
        record = await self._resumed(turn)
        rounds: list[Round] = list(record.rounds)
        if record.text:
            output.resume(record.text, next_index=record.deltas)
        offered = self.tools.specs()
        made = record.made
        waited = record.open
        while True:
            if waited is not None:
                # The round that waited for a decision: planned already.
                start, first, requests = waited.text_start, waited.first, list(waited.requests)
                plans = [
                    self._plan(turn, first + n, request, previous)
                    for n, request in enumerate(requests)
                ]
                waited = None
            else:
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
                    self._plan(turn, made + n, request, previous)
                    for n, request in enumerate(requests)
                ]
                # Keyed by its first call's index and the epoch (the ledger's
                # unique index), so a retried append cannot plan twice. The
                # output's length then says where the round's text ends, for
                # a turn resumed from its record.
                planned = {
                    "index": made,
                    "epoch": turn.epoch,
                    "outputChars": output.length,
                    "calls": [p.planned() for p in plans],
                }
                await self._append(turn, EventType.TOOL_PLANNED, planned)
                made += len(plans)
            outcomes = [await self._decided_call(turn, plan, record, output) for plan in plans]
            rounds.append(Round(output.text[start:], tuple(outcomes)))
        await output.flush()
        return output.text

    async def _resumed(self, turn: TurnRecord) -> _Resumption:
        if turn.epoch <= 1:
            return _Resumption()  # a first claim: nothing to resume
        async with connect(self.engine) as conn:
            return _resumption(await reads.turn_events(conn, turn_id=turn.id))

    async def _decided_call(
        self, turn: TurnRecord, plan: _Plan, record: _Resumption, output: Output
    ) -> ToolOutcome:
        """The call's outcome: recorded already (a resumed turn), refused,
        run, or, when it needs a decision nobody has made, the turn waits."""
        known = (record.known or {}).get(plan.index)
        if known is not None:
            return known
        if plan.index in record.unknown:
            # An intent without a result: running it again could repeat it.
            raise ToolOutcomeUnknown()
        decided = (record.decided or {}).get(plan.index)
        if decided is None and plan.reuse is None:
            if self.approval.requires(plan.request.tool, plan.kind):
                cancel = self.cancels.get(turn.id)
                if cancel is not None:
                    cancel.check()  # a turn asked to stop does not start waiting
                await self._wait(turn, plan, output)
        if decided is not None and decided.decision is ToolCallDecision.REJECT:
            return ToolOutcome(
                plan.index,
                plan.request.tool,
                plan.request.arguments,
                decided.result or refusal(""),
                plan.request.call_id,
            )
        return await self._call(turn, plan)

    async def _wait(self, turn: TurnRecord, plan: _Plan, output: Output) -> None:
        """Record ``tool.approval_requested``, releasing the lease in the same
        statement; raises AwaitingApproval once the turn is WAITING. The text
        streamed so far is recorded first: the turn resumes from its record."""
        cancel = self.cancels.get(turn.id)
        if cancel is not None:
            cancel.check()  # a safe point: a cancelled turn does not start to wait
        await output.flush()
        await output.record_rest()
        data = {**plan.describe(), "epoch": turn.epoch}
        deadline = asyncio.get_running_loop().time() + self.lease_ttl_s
        while True:
            try:
                async with connect(self.engine) as conn:
                    done = await approvals.request(
                        conn, turn_id=turn.id, epoch=turn.epoch, data=data
                    )
                    if not done:
                        # Its own earlier attempt, whose commit answer was lost?
                        now = await approvals.turn(conn, turn_id=turn.id)
                        done = (
                            now is not None
                            and now.status is TurnStatus.WAITING
                            and now.epoch == turn.epoch
                        )
                        if (
                            now is not None
                            and now.status is TurnStatus.RUNNING
                            and now.epoch == turn.epoch
                            and now.cancel_requested_at is not None
                        ):
                            # Its cancel came first: stop here, as at any safe point.
                            raise CancelRequested()
                        if not done:
                            await leases.record_refused_write(
                                conn,
                                turn_id=turn.id,
                                epoch=turn.epoch,
                                attempted=EventType.TOOL_APPROVAL_REQUESTED,
                                by=self.owner,
                            )
                break
            except DatabaseUnavailable:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.bus.committed(turn.session_id)
        if not done:
            raise StaleLease()
        raise AwaitingApproval()

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
            if attempt:
                await asyncio.sleep(_SETTLE_RETRY_S * attempt)
            try:
                calls = await self._calls_of(turn.retry_of)
                if not any(self._askable(c) for c in calls.values()):
                    return calls
                if await self.reconcile(turn.retry_of) == 0:
                    # Every question answered (or a tool said it cannot tell:
                    # then the old key runs again, which such a tool allows).
                    return await self._calls_of(turn.retry_of)
            except DatabaseUnavailable:
                # A lost answer (a tool.reconciled that may have committed
                # included): the next attempt reads what the record holds.
                log.warning("turn %s: reading or settling its earlier calls failed", turn.id)
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
        cancel = self.cancels.get(turn.id)
        if cancel is not None:
            cancel.check()  # before an intent: the last safe point of a call
        await self.crash.point("before_intent", plan.index)
        intent = {**data, "epoch": turn.epoch}
        if plan.previous is not None:
            intent["previous"] = {
                "turnId": str(turn.retry_of),
                "effectKey": plan.previous.effect_key,
                "state": plan.previous.state,
            }
        await self._append(turn, EventType.TOOL_INTENT, intent)
        if cancel is not None:
            cancel.in_flight = plan.index  # from here to its result, no cancel stops it
        await self.crash.point("after_intent", plan.index)
        flags: dict[str, Any] = {}
        if tool is None:
            result: dict[str, Any] = {"error": f"no tool named {plan.request.tool!r}"}
        else:
            result, flags = await self._run(turn, plan, tool)
        await self.crash.point("after_write", plan.index)
        await self._append(
            turn,
            EventType.TOOL_RESULT,
            {**data, "result": result, **flags, "epoch": turn.epoch},
        )
        if cancel is not None:
            cancel.in_flight = None
        await self.crash.point("after_result", plan.index)
        return ToolOutcome(
            plan.index, plan.request.tool, plan.request.arguments, result, plan.request.call_id
        )

    async def _run(
        self, turn: TurnRecord, plan: _Plan, tool: Tool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run the tool: its result, and the flags its ``tool.result`` carries
        beside it when the tool did not answer (see the module's table)."""
        name = plan.request.tool
        try:
            answer = await within(
                tool.run(plan.request.arguments, effect_key=plan.effect_key),
                self.tool_timeout_s,
            )
            return answer, {}
        except EffectRefused as error:
            # Refused, so never applied: recorded as such, never as a completed call.
            return {"error": str(error), "applied": False}, {RECONCILED: True, APPLIED: False}
        except ToolError as error:
            return {"error": str(error)}, {}
        except TimeoutError:
            late = f"{self.tool_timeout_s:g}s (KEYTURN_TOOL_TIMEOUT_S)"
            what = f"{name} did not answer within {late}"
        except ToolServerDied as error:
            what = f"{name}: {error}"
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("turn %s: tool %s failed", turn.id, name)
            what = f"{name} failed ({type(error).__name__}: {error})"
        if plan.kind is ToolKind.READ_ONLY:
            return {"error": what}, {}
        log.warning("turn %s: %s", turn.id, what)
        if plan.kind is ToolKind.IDEMPOTENT and tool.kind is ToolKind.IDEMPOTENT:
            applied = await self._ask(turn, plan, tool)
            if applied is True:
                note = f"{what}; asked afterwards, it says the call was applied"
                return (
                    {"applied": True, "reconciled": True, "note": note},
                    {RECONCILED: True, APPLIED: True},
                )
            if applied is False:
                never = (
                    f"{what}; asked afterwards, it says the call was not applied,"
                    " and now it never will be"
                )
                return {"error": never, "applied": False}, {RECONCILED: True, APPLIED: False}
        unknown = f"{what}; whether it acted is unknown"
        return {"error": unknown, OUTCOME_UNKNOWN: True}, {OUTCOME_UNKNOWN: True}

    async def _ask(self, turn: TurnRecord, plan: _Plan, tool: Tool) -> bool | None:
        """Ask an IDEMPOTENT tool whether the key of a call it did not answer
        was applied, within the call's own time; None if it could not say.
        Its answer is final (a key found not applied never applies), so it is
        the call's outcome even if the call is still at work."""
        try:
            return await within(tool.applied(plan.effect_key), self.tool_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning(
                "turn %s: could not ask %s about %s: %s",
                turn.id,
                plan.request.tool,
                plan.effect_key,
                str(error) or type(error).__name__,
            )
            return None

    async def _append(self, turn: TurnRecord, type: EventType, data: dict[str, Any]) -> None:
        async def write(conn: Conn) -> db.Appended:
            return await db.append(conn, turn_id=turn.id, epoch=turn.epoch, type=type, data=data)

        try:
            await append_fenced(
                engine=self.engine,
                bus=self.bus,
                turn=turn,
                owner=self.owner,
                lease_ttl_s=self.lease_ttl_s,
                attempted=type,
                write=write,
            )
        except DatabaseUnavailable:
            # Past the lease, the call this entry belongs to is of unknown outcome.
            raise ToolOutcomeUnknown() from None

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
                applied = await within(tool.applied(call.effect_key), self.question_timeout_s)
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
            await self.crash.point("before_reconciled", call.index)
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

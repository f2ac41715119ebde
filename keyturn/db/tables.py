"""SQLModel tables: the record Keyturn keeps in PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from keyturn.db.sql import literal, literals
from keyturn.domain import (
    ONCE_PER_CALL_EVENTS,
    TERMINAL_STATUSES,
    EventType,
    KeyKind,
    Multitask,
    TurnStatus,
)

# Ledger events written at most once per key (the index below).
_LEDGER_ONCE = (EventType.TOOL_PLANNED, *ONCE_PER_CALL_EVENTS)

# Names for constraints, so migrations and error mapping can refer to them.
metadata = SQLModel.metadata
metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
}

# The database refuses a status or an event type the code does not know.
TURN_STATUS_CHECK = f"status IN ({literals(TurnStatus)})"
EVENT_TYPE_CHECK = f"type IN ({literals(EventType)})"
# The predicate of ix_turns_queued_age, which the claim's walk repeats.
QUEUED_BY_AGE = f"status = {literal(TurnStatus.QUEUED)} AND epoch >= 0"


def _now_column(nullable: bool = False) -> Any:
    return Column(
        DateTime(timezone=True),
        nullable=nullable,
        server_default=None if nullable else text("now()"),
    )


class SessionBase(SQLModel):
    default_history: str = Field(sa_column=Column(Text, nullable=False))
    # What a submission does while a turn of the session is queued or running
    # (a submission may say otherwise for itself).
    multitask: str = Field(
        default=Multitask.ENQUEUE.value,
        sa_column=Column(Text, nullable=False, server_default=text(literal(Multitask.ENQUEUE))),
    )


class Session(SessionBase, table=True):
    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_tenant_created", "tenant", "created_at", "id"),
        CheckConstraint(f"multitask IN ({literals(Multitask)})", name="multitask_known"),
    )

    id: uuid.UUID = Field(primary_key=True)
    # The tenant of the token that created the session ("" when the server
    # runs without tokens). Everything in the session is visible to it alone.
    tenant: str = Field(
        default="", sa_column=Column(Text, nullable=False, server_default=text("''"))
    )
    created_at: datetime = Field(sa_column=_now_column())
    # The last seq handed out to this session's events. Bumped in the same
    # transaction that appends an event: the row lock orders the commits, so
    # seq is gapless and commit-ordered (a sequence would be neither).
    event_seq: int = Field(
        default=0, sa_column=Column(BigInteger, nullable=False, server_default=text("0"))
    )


class TurnBase(SQLModel):
    idempotency_key: str = Field(sa_column=Column(Text, nullable=False))
    input: str = Field(sa_column=Column(Text, nullable=False))
    history: str = Field(sa_column=Column(Text, nullable=False))


class Turn(TurnBase, table=True):
    __tablename__ = "turns"
    __table_args__ = (
        # The one place that decides which submission named a key first.
        UniqueConstraint("session_id", "idempotency_key"),
        # One RUNNING turn per session, whatever any process believes.
        Index(
            "ux_turns_one_running_per_session",
            "session_id",
            unique=True,
            postgresql_where=text(f"status = {literal(TurnStatus.RUNNING)}"),
        ),
        # Where the claimers look for work.
        Index(
            "ix_turns_queued",
            "session_id",
            "admit_seq",
            postgresql_where=text(f"status = {literal(TurnStatus.QUEUED)}"),
        ),
        # The oldest queued turns first: the claim looks there before it
        # reads the whole queue (keyturn.db.leases). Its predicate adds a
        # condition every turn meets (epoch >= 0), so that only a statement
        # that says so too can read it: the claim's tests of one session's
        # queue must read ix_turns_queued, and on statistics taken while
        # nothing was queued the two cost the same, and the planner took
        # this one and read the whole queue for each session
        # (bench/README.md). (Not created_at IS NOT NULL: PostgreSQL 17
        # drops that condition from a query, created_at being NOT NULL.)
        Index(
            "ix_turns_queued_age",
            "created_at",
            "admit_seq",
            postgresql_where=text(QUEUED_BY_AGE),
        ),
        # Turns waiting for a decision on a tool call: the claim checks that
        # none holds a session, and pendingApprovals lists them.
        Index(
            "ix_turns_waiting",
            "session_id",
            postgresql_where=text(f"status = {literal(TurnStatus.WAITING)}"),
        ),
        Index(
            "ix_turns_running_lease",
            "lease_until",
            postgresql_where=text(f"status = {literal(TurnStatus.RUNNING)}"),
        ),
        Index("ix_turns_session_admit", "session_id", "admit_seq", unique=True),
        # Where the retention sweeper looks for ended turns, oldest first.
        Index(
            "ix_turns_ended",
            "completed_at",
            postgresql_where=text(f"status IN ({literals(TERMINAL_STATUSES)})"),
        ),
        # Deleting a turn (the retention sweeper) checks that no retry names
        # it: without this, one scan of all turns per pruned turn.
        Index("ix_turns_retry_of", "retry_of", postgresql_where=text("retry_of IS NOT NULL")),
        # A cancel's key names one cancel in its session, as a turn's names one turn.
        Index(
            "ux_turns_cancel_key",
            "session_id",
            "cancel_key",
            unique=True,
            postgresql_where=text("cancel_key IS NOT NULL"),
        ),
        CheckConstraint(TURN_STATUS_CHECK, name="status_known"),
    )

    id: uuid.UUID = Field(primary_key=True)
    session_id: uuid.UUID = Field(foreign_key="sessions.id", nullable=False)
    # sha256 of the effective request (input + resolved history).
    fingerprint: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False))
    output: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # The seq of this turn's turn.started event: its place in the session queue.
    admit_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(sa_column=_now_column())
    started_at: datetime | None = Field(default=None, sa_column=_now_column(nullable=True))
    completed_at: datetime | None = Field(default=None, sa_column=_now_column(nullable=True))
    # Work claiming: who runs it, until when (database clock), and a fencing
    # epoch that every later write for the turn must present.
    owner: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    lease_until: datetime | None = Field(default=None, sa_column=_now_column(nullable=True))
    epoch: int = Field(
        default=0, sa_column=Column(BigInteger, nullable=False, server_default=text("0"))
    )
    # The interrupted turn this one retries (resolveInterruptedTurn RETRY).
    retry_of: uuid.UUID | None = Field(default=None, foreign_key="turns.id", nullable=True)
    # The turn's cancel, at most one (cancelTurn, or a submission with
    # multitask INTERRUPT, which has no key): when it was asked for, why, and
    # the key and fingerprint that make cancelTurn idempotent.
    cancel_requested_at: datetime | None = Field(default=None, sa_column=_now_column(nullable=True))
    cancel_reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    cancel_key: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    cancel_fingerprint: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class Event(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        Index("ix_events_turn", "turn_id", "seq"),
        # The tool ledger: at most one plan (keyed by its first call's index),
        # one intent, one result and one reconciliation per call of a turn
        # and epoch (a reconciliation names no epoch). A write retried after a
        # lost connection, or two processes settling one call, cannot append
        # twice; a turn handed back and claimed again plans anew.
        Index(
            "ux_events_tool_call",
            "turn_id",
            "type",
            text("(data ->> 'index')"),
            text("(COALESCE(data ->> 'epoch', ''))"),
            unique=True,
            postgresql_where=text(f"type IN ({literals(_LEDGER_ONCE)})"),
        ),
        # One turn.delta per index of a turn's epoch: a delta retried after a
        # lost connection cannot append twice.
        Index(
            "ux_events_turn_delta",
            "turn_id",
            text("(data ->> 'epoch')"),
            text("(data ->> 'index')"),
            unique=True,
            postgresql_where=text(f"type = {literal(EventType.TURN_DELTA)}"),
        ),
        # A decision key (decideToolCall) names one decision in its session.
        Index(
            "ux_events_decision_key",
            "session_id",
            text("(data ->> 'idempotencyKey')"),
            unique=True,
            postgresql_where=text(
                f"type IN ({literals((EventType.TOOL_APPROVED, EventType.TOOL_REJECTED))})"
            ),
        ),
        CheckConstraint(EVENT_TYPE_CHECK, name="type_known"),
    )

    id: int | None = Field(
        default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True)
    )
    session_id: uuid.UUID = Field(foreign_key="sessions.id", nullable=False)
    turn_id: uuid.UUID | None = Field(default=None, foreign_key="turns.id", nullable=True)
    seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    type: str = Field(sa_column=Column(Text, nullable=False))
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSONB, nullable=False))
    created_at: datetime = Field(sa_column=_now_column())


class ApiToken(SQLModel, table=True):
    """An API token. Only a hash of the secret is kept; the secret is shown once."""

    __tablename__ = "api_tokens"

    id: uuid.UUID = Field(primary_key=True)
    name: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    tenant: str = Field(sa_column=Column(Text, nullable=False))
    token_hash: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    created_at: datetime = Field(sa_column=_now_column())
    revoked_at: datetime | None = Field(default=None, sa_column=_now_column(nullable=True))


class Resolution(SQLModel, table=True):
    """An explicit decision about an interrupted turn: RETRY or ABANDON.

    Keyed like admissions: the unique ``(session_id, idempotency_key)`` decides
    which request named a key first. One decision per interrupted turn."""

    __tablename__ = "resolutions"
    __table_args__ = (
        # Which resolution admitted a turn (the retention sweeper keeps those).
        Index(
            "ix_resolutions_new_turn_id",
            "new_turn_id",
            postgresql_where=text("new_turn_id IS NOT NULL"),
        ),
        UniqueConstraint("session_id", "idempotency_key"),
        UniqueConstraint("turn_id"),
    )

    id: uuid.UUID = Field(primary_key=True)
    session_id: uuid.UUID = Field(foreign_key="sessions.id", nullable=False)
    turn_id: uuid.UUID = Field(foreign_key="turns.id", nullable=False)
    idempotency_key: str = Field(sa_column=Column(Text, nullable=False))
    # sha256 of the effective request (action, turn id, force).
    fingerprint: str = Field(sa_column=Column(Text, nullable=False))
    action: str = Field(sa_column=Column(Text, nullable=False))
    force: bool = Field(sa_column=Column(Boolean, nullable=False))
    # RETRY: the new turn admitted under the key.
    new_turn_id: uuid.UUID | None = Field(default=None, foreign_key="turns.id", nullable=True)
    created_at: datetime = Field(sa_column=_now_column())


class SessionDeletion(SQLModel, table=True):
    """A deleted session's deletion key: all that is kept of the session.

    Keyed per tenant, not per session (the session is gone): the same key
    for the same session replays the deletion's answer, for another session
    it conflicts. No foreign key: the session it names no longer exists."""

    __tablename__ = "session_deletions"

    tenant: str = Field(sa_column=Column(Text, primary_key=True))
    idempotency_key: str = Field(sa_column=Column(Text, primary_key=True))
    session_id: uuid.UUID = Field(nullable=False)
    deleted_at: datetime = Field(sa_column=_now_column())


class KeyTombstone(SQLModel, table=True):
    """What stays of a turn the retention sweeper pruned: its key, so that a
    retry answers KeyExpired instead of admitting a new turn, until the
    tombstone itself is forgotten (KEYTURN_TOMBSTONE_RETENTION).

    Keyed like the turns it replaces: one per ``(session_id, idempotency_key)``.
    It goes with its session, should the session be deleted."""

    __tablename__ = "key_tombstones"
    __table_args__ = (Index("ix_key_tombstones_pruned_at", "pruned_at"),)

    session_id: uuid.UUID = Field(
        sa_column=Column(
            ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    idempotency_key: str = Field(sa_column=Column(Text, primary_key=True))
    fingerprint: str = Field(sa_column=Column(Text, nullable=False))
    # The pruned turn's id (no foreign key: the row is gone).
    turn_id: uuid.UUID = Field(nullable=False)
    ended_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    expired_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    pruned_at: datetime = Field(sa_column=_now_column())


class SessionKey(SQLModel, table=True):
    """Every key a session's requests took, whatever took it: one namespace.

    Each write that takes a key (admission, a resolution, a cancel, a
    decision on a tool call) inserts its row here in the same statement or
    transaction, so the primary key alone decides which request owns a key,
    against what is committed, not against what a statement saw when it
    began. A key stays while anything of its turn is kept: a pruned turn's
    keys go with its tombstone."""

    __tablename__ = "session_keys"
    __table_args__ = (
        CheckConstraint(f"kind IN ({literals(KeyKind)})", name="kind_known"),
        # The keys that decided a turn, found by it when its tombstone goes;
        # partial, so that admission's TURN rows do not pay for it.
        Index(
            "ix_session_keys_decided",
            "turn_id",
            postgresql_where=text(f"kind <> {literal(KeyKind.TURN)}"),
        ),
    )

    session_id: uuid.UUID = Field(
        sa_column=Column(
            ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    idempotency_key: str = Field(sa_column=Column(Text, primary_key=True))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    # The turn the key concerns: the one submitted, resolved, cancelled or
    # decided (no foreign key: a pruned turn's keys outlive its row).
    turn_id: uuid.UUID = Field(nullable=False)


class SyntheticEffect(SQLModel, table=True):
    """The external store the synthetic tools write to. Not the runtime's
    record: written on its own connection, in its own transaction, so a crash
    between it and the ledger is possible and observable.

    ``applied`` false is a settled "never": asking an idempotent tool whether a
    key was applied claims the key when it was not, so a late write with that
    key cannot land afterwards."""

    __tablename__ = "synthetic_effects"
    __table_args__ = (
        # The idempotent tool applies a key at most once; the unsafe one may repeat.
        Index(
            "ux_synthetic_effects_idempotent_key",
            "effect_key",
            unique=True,
            postgresql_where=text("idempotent"),
        ),
        Index("ix_synthetic_effects_key", "effect_key"),
    )

    id: int | None = Field(
        default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True)
    )
    effect_key: str = Field(sa_column=Column(Text, nullable=False))
    tool: str = Field(sa_column=Column(Text, nullable=False))
    idempotent: bool = Field(sa_column=Column(Boolean, nullable=False))
    applied: bool = Field(sa_column=Column(Boolean, nullable=False))
    name: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    value: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=_now_column())

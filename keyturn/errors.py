"""Every exception Keyturn raises. Each class's docstring is its default message.

A leaf: it imports nothing from Keyturn. Which of these a client sees, and
with what ``extensions.code``, is decided in one place, by
:mod:`keyturn.schema.errors`; anything not listed there is masked.
"""

from __future__ import annotations


class KeyturnError(Exception):
    """Keyturn could not do that."""

    def __init__(self, message: str | None = None) -> None:
        # A docstring's line breaks and indentation are not part of the message.
        super().__init__(message or " ".join((self.__doc__ or "").split()))


# -- the client's mistakes ----------------------------------------------------
class InvalidArgument(KeyturnError):
    """An argument is out of range or malformed."""


class InvalidRequest(InvalidArgument):
    """The request is not valid."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field  # the input field at fault, as the client spells it


class NotFound(KeyturnError):
    """Not found."""


class ResponseTooLarge(KeyturnError):
    """The response would grow past the limit (KEYTURN_MAX_RESPONSE_BYTES); the
    answer is this error alone, with no data."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the response would be larger than the limit of {limit} bytes: ask for fewer "
            "items or fewer large fields (input, output, data)"
        )
        self.limit = limit


class SessionDeleted(NotFound):
    """The session was deleted."""

    def __init__(self, session_id: object) -> None:
        super().__init__(f"session {session_id} was deleted")
        self.session_id = session_id


class TokenNameTaken(KeyturnError):
    """A token with that name exists already."""


# -- moving a session between Keyturns (keyturn export / import) --------------
class TransferRefused(KeyturnError):
    """The session cannot be exported or imported as asked; nothing was written."""


# -- conditions a retry may outlast -------------------------------------------
class DatabaseUnavailable(KeyturnError):
    """The database did not answer; the request may be retried."""


class DatabaseBusy(DatabaseUnavailable):
    """The database is busy (a statement or a lock wait ran past its timeout, or
    no connection came free in time); nothing was written, and the request may
    be retried."""


class OutcomeUnknown(DatabaseUnavailable):
    """The connection was lost while the database was committing; retry with the same key."""


class ShuttingDown(KeyturnError):
    """This server is shutting down and admits no new turns; retry on another."""


# -- inside a running turn ----------------------------------------------------
class StaleLease(KeyturnError):
    """The turn's lease passed to another owner; this write was refused."""


class CancelRequested(KeyturnError):
    """The turn's cancel was asked for: it stops at this safe point, with what
    it recorded so far."""


class ModelError(KeyturnError):
    """The model could not produce a reply."""


class ToolError(KeyturnError):
    """The tool could not do what was asked."""


class EffectRefused(ToolError):
    """The tool refused the effect: its key was settled as never applied, so
    it will not apply (a retry runs such a call under a key of its own)."""


class ToolsFileError(KeyturnError):
    """The tools file (KEYTURN_TOOLS_FILE) is not valid."""


class ToolSetupError(KeyturnError):
    """A tool could not be set up at start: a server that did not start, an
    entry point that did not load, or a name offered twice."""


class ToolServerUnavailable(KeyturnError):
    """The tool's server is not connected; the call was not sent."""


class ToolServerDied(KeyturnError):
    """The tool's server went away during the call; nobody knows what it did."""


class ToolOutcomeUnknown(KeyturnError):
    """A call's outcome cannot even be recorded (the record's own write failed
    past the lease, or a resumed turn meets an intent with no answer); the
    turn is left to be interrupted and reconciled, not finished. A tool that
    merely gives no answer is recorded as such and the turn goes on."""


class AwaitingApproval(KeyturnError):
    """The turn waits for a decision on a tool call (decideToolCall); it holds
    no lease until one comes."""

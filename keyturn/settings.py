"""Settings, read from the environment (prefix ``KEYTURN_``) when the app is built.

Nothing else in Keyturn reads the environment: every module that needs a
setting is handed this object (or a value from it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

# Also what a request's context holds when it is built without settings.
DEFAULT_MAX_QUERY_COST = 200_000
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024

# A retention: ``forever`` (or unset), or a whole number and a unit.
_RETENTION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
# Published in seconds as a GraphQL Int (32 bits).
_LONGEST_S = 2**31 - 1


def parse_retention(value: object, info: ValidationInfo) -> int | None:
    """``90s``, ``24h``, ``30d`` → seconds; ``forever`` → None (keep forever)."""
    name = f"KEYTURN_{info.field_name.upper()} " if info.field_name else ""
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _LONGEST_S
    ):
        return value  # unset, or seconds already
    text = str(value).strip().lower()
    if text == "forever":
        return None
    found = _RETENTION.fullmatch(text)
    if found is None or int(found[1]) == 0:
        raise ValueError(
            f"{name}{str(value)!r} is not a retention: write forever, or a number above 0 and a "
            "unit s, m, h or d (90s, 24h, 30d)"
        )
    seconds = int(found[1]) * _UNIT_S[found[2]]
    if seconds > _LONGEST_S:
        raise ValueError(f"{name}{str(value)!r} is longer than 68 years: write forever")
    return seconds


def format_retention(seconds: int | None) -> str:
    """The human form of a retention: ``forever``, ``24h``, ``90s`` (the
    largest unit that divides it)."""
    if seconds is None:
        return "forever"
    unit = next(u for u, size in _UNIT_S.items() if seconds % size == 0)
    return f"{seconds // _UNIT_S[unit]}{unit}"


# Seconds, or None for forever.
Retention = Annotated[int | None, BeforeValidator(parse_retention)]

_LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_log_level(value: object) -> str:
    """A logging level by its name, in any case; refused when settings are
    read, so that no command meets it later as a traceback from logging."""
    level = str(value).strip().lower()
    if level not in _LEVELS:
        raise ValueError(f"{str(value)!r} is not a level: {', '.join(_LEVELS)}")
    return level


LogLevel = Annotated[str, BeforeValidator(parse_log_level)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KEYTURN_", extra="ignore")

    # No URL means: start the embedded PostgreSQL kept under ``data_dir``.
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("KEYTURN_DATABASE_URL", "DATABASE_URL"),
    )
    data_dir: Path = Path(".keyturn")
    host: str = "127.0.0.1"
    port: int = 8000

    # Database connections per process; requests beyond it wait for one.
    pool_size: int = Field(default=20, ge=1)
    # How long a request waits for a connection of the pool before it answers
    # UNAVAILABLE (retryable). A few seconds: longer than a burst lasts, and
    # shorter than the client's own timeout, so the client hears why and may
    # retry with the same key rather than give up on a silent connection.
    pool_timeout_s: float = Field(default=5.0, gt=0)
    # The worker's own pool (claims, lease renewals, finishes, the tool
    # ledger), apart from the requests', so that no burst of reads delays a
    # renewal. Unset: max_running_turns + 2, room for every running turn to
    # renew at the same moment plus the claim loop and its sweep.
    work_pool_size: int | None = Field(default=None, ge=1)
    # GraphQL requests over HTTP one tenant may have running at once in a
    # process (the open server is the one tenant ""); the next ones wait
    # briefly, then answer UNAVAILABLE. Unset: half the pool, at least 1, so
    # one tenant can never hold every connection while others wait.
    tenant_max_concurrent: int | None = Field(default=None, ge=1)
    # Added to every turn the fixture model runs, in milliseconds.
    fixture_delay_ms: int = Field(default=0, ge=0)
    # Rounds of tool calls one turn's model may ask for before it replies;
    # one more fails the turn (a model that never stops calling tools).
    max_tool_rounds: int = Field(default=8, ge=1)
    # Which model answers turns: the offline fixture, or any server speaking
    # OpenAI's chat completions (keyturn.runtime.openai_model).
    model: Literal["fixture", "openai"] = "fixture"
    openai_base_url: str = "https://api.openai.com/v1"
    # A secret: it prints as ********** and is handed only to the SDK.
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("KEYTURN_OPENAI_API_KEY", "OPENAI_API_KEY"),
    )
    # Required with model=openai: the name the server knows the model by.
    openai_model: str | None = None
    # How long the model server may keep a request (or a stream between two
    # chunks) waiting before the attempt fails.
    openai_timeout_s: float = Field(default=60.0, gt=0)
    # Sent first in every request to the model, when set.
    system_prompt: str | None = None
    # What a FULL history shows a model: the latest N earlier turns, read
    # newest first and bounded by the statement; then the adapter drops the
    # oldest of those until their messages fit in this many characters.
    history_max_turns: int = Field(default=50, ge=1)
    history_max_chars: int = Field(default=100_000, ge=1)
    # While a model streams, a turn records at most one turn.delta event per
    # this many milliseconds (the text in between is coalesced), plus the last
    # piece, written with the turn's end.
    delta_flush_ms: int = Field(default=100, ge=1)
    # Turns this process runs at once (across sessions; one per session always).
    max_running_turns: int = Field(default=32, ge=1)

    # Leases: a running turn's owner renews it every ``lease_renew_s``; a lease
    # not renewed for ``lease_ttl_s`` marks its turn INTERRUPTED.
    lease_ttl_s: float = Field(default=10.0, gt=0)
    lease_renew_s: float = Field(default=3.0, gt=0)
    # How often a process looks for queued turns and expired leases that no
    # wake-up told it about (turns left by a stopped process, for example).
    claim_poll_s: float = Field(default=1.0, gt=0)
    # After a wake-up (an admission, a turn's end), how long the claim waits
    # for the others that follow it, so that one statement and one commit
    # claim them together (python -m bench.turns at half of peak, ten rounds
    # each: submitTurn p50 8.5 ms with 3, 12.4 ms with none; 6 did worse).
    claim_debounce_ms: float = Field(default=3.0, ge=0, le=1000)
    # Safety net for subscriptions: how often live subscribers re-check the
    # record in case a wake-up was missed.
    subscription_poll_s: float = Field(default=2.0, gt=0)
    # Seconds a stopping process lets running turns finish before it hands
    # them back to the queue.
    shutdown_grace_s: float = Field(default=20.0, ge=0)
    # How long deleteSession waits for the session's running turn to stop
    # once it has asked it to; past it the answer is SessionBusy and the
    # same key, sent again, carries on. As long as a lease by default: a turn
    # whose process died is interrupted within about that long. A turn held
    # by a tool call in flight (up to tool_timeout_s) may need a retry.
    delete_wait_s: float = Field(default=10.0, ge=0)

    # A TOML file naming MCP servers whose tools the model may call, and
    # per-tool overrides of their kinds (keyturn.runtime.tools_file).
    tools_file: Path | None = None
    # How long one tool call may take. Past it the call is recorded as
    # unanswered and the turn goes on: a READ_ONLY call as an error, an
    # IDEMPOTENT one as its own answer to "was it applied?", any other's
    # effect as unknown (OUTCOME_UNKNOWN).
    tool_timeout_s: float = Field(default=30.0, gt=0)
    # Every call of an UNSAFE tool waits for decideToolCall before it runs
    # (the tools file's ``approve`` decides per tool, over this).
    approve_unsafe: bool = False

    # The record's lifetime (keyturn.runtime.retention). How long after its
    # turn ended a key answers replays; after it the key answers KeyExpired.
    key_retention: Retention = None
    # How long after it ended a turn keeps its input, output and event data;
    # then the sweeper leaves a tombstone for its key. At least key_retention.
    turn_retention: Retention = None
    # How long a tombstone is kept after its turn was pruned; then the key is
    # forgotten and may name a new turn.
    tombstone_retention: Retention = None
    # How often the sweeper runs a pass, and the rows one of its batches
    # (one short transaction) may touch.
    retention_sweep_s: float = Field(default=60.0, gt=0)
    retention_batch: int = Field(default=200, ge=1, le=10_000)
    # The events one batch of turns may blank: a batch stops short of its
    # turns when theirs add up to more (a turn above it is pruned alone).
    retention_batch_events: int = Field(default=20_000, ge=1, le=1_000_000)

    # Test hook, never for production: stop the process with SIGKILL at a
    # named point of a tool call, ``POINT`` or ``POINT:INDEX`` with POINT one of
    # before_intent, after_intent, after_write, after_result, or of a retention
    # batch, prune_batch (keyturn.runtime.crash). The first
    # ``crash_after - 1`` calls to reach it wait there; the next one kills.
    crash_at: str | None = None
    crash_after: int = Field(default=1, ge=1)
    # Test hook, never for production: hold every call that reaches a point
    # (``POINT`` or ``POINT:INDEX``, as crash_at) until the file hold_until exists.
    hold_at: str | None = None
    hold_until: Path | None = None

    graphiql: bool = True
    # Off in production if clients need not discover the schema at run time.
    introspection: bool = True

    # How often a process re-checks tokens (a revoked token stops working, and
    # its live subscriptions close, within about this long).
    auth_recheck_s: float = Field(default=2.0, gt=0)
    # Browser pages on these origins may open WebSockets (comma-separated);
    # the server's own origin always may. Non-browser clients send no Origin.
    allowed_origins: str = ""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    max_subscriptions_per_connection: int = Field(default=100, ge=1)
    max_query_depth: int = Field(default=10, ge=1)
    # What a query may cost (keyturn.schema.cost: page sizes times what they
    # select), checked before it runs; and how large its answer may grow.
    max_query_cost: int = Field(default=DEFAULT_MAX_QUERY_COST, ge=1)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024)
    connection_init_timeout_s: float = Field(default=10.0, gt=0)
    # Persisted documents (keyturn.http.persisted): ``auto`` learns a document
    # the first time its text comes with its hash (Apollo's APQ);
    # ``registered_only`` runs only the documents of ``persisted_documents_file``
    # (a JSON object mapping SHA-256 to text), so nothing else can be executed.
    persisted_documents: Literal["auto", "registered_only"] = "auto"
    persisted_documents_file: Path | None = None
    # /metrics tells whoever reads it how much traffic there is: once tokens
    # exist it needs one, unless this opens it for a scraper on a private network.
    metrics_public: bool = False
    log_level: LogLevel = "info"
    # `keyturn serve` writes JSON lines (json) or lines for people (text);
    # auto: text on a terminal, JSON otherwise.
    log_format: Literal["auto", "json", "text"] = "auto"
    # Inputs are the users' words: logged only when this is true.
    log_inputs: bool = False
    # Set by `keyturn serve --workers N` (prometheus-client's own variable):
    # every worker writes its samples there and a scrape sums them.
    metrics_multiproc_dir: Path | None = Field(
        default=None, validation_alias=AliasChoices("PROMETHEUS_MULTIPROC_DIR")
    )

    @property
    def work_pool(self) -> int:
        """The worker's pool size, ``work_pool_size`` or its default."""
        return self.work_pool_size or self.max_running_turns + 2

    @property
    def tenant_concurrency(self) -> int:
        """One tenant's running requests, ``tenant_max_concurrent`` or its default."""
        return self.tenant_max_concurrent or max(1, self.pool_size // 2)

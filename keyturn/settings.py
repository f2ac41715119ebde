"""Settings, read from the environment (prefix ``KEYTURN_``) when the app is built."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    pool_size: int = Field(default=10, ge=1)
    # Added to every turn the fixture model runs, in milliseconds.
    fixture_delay_ms: int = Field(default=0, ge=0)
    # Turns this process runs at once (across sessions; one per session always).
    max_running_turns: int = Field(default=32, ge=1)

    # Leases: a running turn's owner renews it every ``lease_renew_s``; a lease
    # not renewed for ``lease_ttl_s`` marks its turn INTERRUPTED.
    lease_ttl_s: float = Field(default=10.0, gt=0)
    lease_renew_s: float = Field(default=3.0, gt=0)
    # How often a process looks for queued turns and expired leases that no
    # wake-up told it about (turns left by a stopped process, for example).
    claim_poll_s: float = Field(default=1.0, gt=0)
    # Safety net for subscriptions: how often live subscribers re-check the
    # record in case a wake-up was missed.
    subscription_poll_s: float = Field(default=2.0, gt=0)
    # Seconds a stopping process lets running turns finish before it hands
    # them back to the queue.
    shutdown_grace_s: float = Field(default=20.0, ge=0)

    graphiql: bool = True
    log_level: str = "info"

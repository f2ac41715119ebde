"""Alembic environment: runs migrations on the connection ``keyturn.db.migrate`` hands in."""

from __future__ import annotations

from alembic import context

from keyturn.db.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only through keyturn.db.migrate
    raise RuntimeError("run migrations with `keyturn db upgrade`")

context.configure(connection=connection, target_metadata=metadata, compare_type=True)
with context.begin_transaction():
    context.run_migrations()

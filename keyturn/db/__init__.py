"""The record: SQLModel tables, the engine, queries, migrations, the embedded server.

Nothing here imports from the layers above it.
"""

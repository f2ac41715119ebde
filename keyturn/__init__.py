"""Keyturn: a GraphQL service for an agent runtime with idempotent turn admission."""

__version__ = "0.1.0"

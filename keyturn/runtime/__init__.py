"""The rules: admission, fingerprints, the per-session queue, execution, the
fixture model, leases, the event bus. Knows nothing of GraphQL."""

"""The benchmark: Keyturn beside its floor (raw asyncpg) and a peer (hand-written REST)."""

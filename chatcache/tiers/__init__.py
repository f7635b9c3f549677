"""The cache tiers an engine keeps: the session tier's conversations in memory
(`conversations`, over `storage`), the turn tier's entries (`turn_tier`), and the token tier of
per-session KV (`token_tier`, `kv`, spilled by `kv_spill`)."""

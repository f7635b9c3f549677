"""The cache tiers an engine keeps: the session tier's conversations in memory
(`conversations`, over `storage`), the turn tier (`turn_tier`), the token tier of per-session KV
(`token_tier`, `kv`, spilled by `kv_spill`), and the bound on sessions held in memory (`residency`)."""

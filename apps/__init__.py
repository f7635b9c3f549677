"""User-facing programs built on chatcache: the line-mode chat (and, later, the terminal app)."""

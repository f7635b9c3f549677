"""The turn tier: short-lived, in-process context of each session's current topic.

What belongs here is worth keeping only while the topic lasts: intent candidates, slot values
the user has not confirmed, turn embeddings, anything cached for this turn's context. Entries
expire after a TTL (default 5 minutes), each session holds a bounded number of them, and the
tier holds a bounded number of sessions; drift or the end of a session drops them at once.
Nothing here is persisted: confirmed facts are promoted to the session tier instead.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class TurnTierConfig:
    """Attributes:
    ttl_s: seconds an entry lives after it was written.
    max_entries_per_session: the oldest entry of a session goes first beyond this.
    max_sessions: the least recently used session goes first beyond this.
    """

    ttl_s: float = 300.0
    max_entries_per_session: int = 256
    max_sessions: int = 10_000

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ConfigError(f"turn tier ttl_s must be positive, got {self.ttl_s}")
        if self.max_entries_per_session < 1 or self.max_sessions < 1:
            raise ConfigError("turn tier bounds must be at least 1")


class TurnTier:
    """Per-session dicts whose entries expire; safe to use from several threads."""

    def __init__(self, config: TurnTierConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or TurnTierConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, OrderedDict[str, tuple[float, Any]]] = OrderedDict()

    def put(self, session_id: str, key: str, value: Any) -> None:
        with self._lock:
            entries = self._sessions.setdefault(session_id, OrderedDict())
            self._sessions.move_to_end(session_id)
            entries[key] = (self._clock() + self.config.ttl_s, value)
            entries.move_to_end(key)
            while len(entries) > self.config.max_entries_per_session:
                entries.popitem(last=False)
            while len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)

    def get(self, session_id: str, key: str, default: Any = None) -> Any:
        with self._lock:
            entries = self._sessions.get(session_id)
            if entries is None or key not in entries:
                return default
            expires, value = entries[key]
            if expires <= self._clock():
                del entries[key]
                return default
            return value

    def items(self, session_id: str) -> dict[str, Any]:
        """The session's live entries."""
        with self._lock:
            now = self._clock()
            entries = self._sessions.get(session_id, OrderedDict())
            return {key: value for key, (expires, value) in entries.items() if expires > now}

    def invalidate(self, session_id: str) -> int:
        """Drop everything of a session (drift, end of session); returns how many entries went."""
        with self._lock:
            return len(self._sessions.pop(session_id, {}))

    def clear(self) -> None:
        """Drop every session's entries (the user cleared the caches)."""
        with self._lock:
            self._sessions.clear()

    def purge_expired(self) -> int:
        """Remove expired entries everywhere; returns how many went."""
        removed = 0
        with self._lock:
            now = self._clock()
            for session_id in list(self._sessions):
                entries = self._sessions[session_id]
                for key in [k for k, (expires, _) in entries.items() if expires <= now]:
                    del entries[key]
                    removed += 1
                if not entries:
                    del self._sessions[session_id]
        return removed

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._sessions.values())

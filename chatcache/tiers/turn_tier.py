"""The turn tier: short-lived, in-process context of a session's current topic.

What belongs here is worth keeping only while the topic lasts: intent candidates, slot values
the user has not confirmed, turn embeddings, anything cached for this turn's context. Entries
expire after a TTL (default 5 minutes) and a session holds a bounded number of them; drift
drops them at once. Each session's entries live in its memory (`SessionMemory`), so a session
that ends or is let go of takes them with it, and the engine's memory bound counts them with
the rest of the session. Nothing here is persisted: confirmed facts are promoted to the
session tier instead.
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

    How many sessions hold entries is the engine's memory bound (`MemoryConfig`).
    """

    ttl_s: float = 300.0
    max_entries_per_session: int = 256

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ConfigError(f"turn tier ttl_s must be positive, got {self.ttl_s}")
        if self.max_entries_per_session < 1:
            raise ConfigError(f"turn tier max_entries_per_session must be at least 1, got {self.max_entries_per_session}")


class TurnEntries:
    """One session's turn-tier entries, which expire; safe to use from several threads (a
    turn writes them while the engine's upkeep purges expired ones)."""

    def __init__(self, config: TurnTierConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()  # key -> (expiry, value), oldest write first

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._entries[key] = (self._clock() + self.config.ttl_s, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.config.max_entries_per_session:
                self._entries.popitem(last=False)

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            if key not in self._entries:
                return default
            expires, value = self._entries[key]
            if expires <= self._clock():
                del self._entries[key]
                return default
            return value

    def items(self) -> dict[str, Any]:
        """The live entries."""
        with self._lock:
            now = self._clock()
            return {key: value for key, (expires, value) in self._entries.items() if expires > now}

    def clear(self) -> int:
        """Drop every entry (drift, the user cleared the caches); returns how many went."""
        with self._lock:
            dropped = len(self._entries)
            self._entries.clear()
            return dropped

    def purge_expired(self) -> int:
        """Remove expired entries; returns how many went."""
        with self._lock:
            now = self._clock()
            expired = [key for key, (expires, _) in self._entries.items() if expires <= now]
            for key in expired:
                del self._entries[key]
            return len(expired)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

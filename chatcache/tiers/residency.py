"""The engine's memory bound: which sessions keep state in memory, and which are let go of.

Every session that has turns leaves state in memory: its conversation, its drift topic, its
turn-tier entries, its token-tier heat and KV. Users leave without saying so, so the engine
lets go of them itself, each time a session is opened: beyond `max_sessions_in_memory` the
least recently used go, and (looked for at most every `sweep_every_s`) those unused for
`idle_seconds` go too. A session let go of is not ended: its next turn rebuilds it from the
session tier and restores its KV from disk or recomputes it. A session in a turn is never let
go of; it counts as just used. The session tier's expiry runs from here too, at most every
`expire_every_s` (so a one-turn process such as `chatcache ask` leaves it to longer-lived ones).

Deliberately no timer thread: an engine without turns keeps what its last turns left, and
nothing runs beside the caller's threads.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class MemoryConfig:
    """How much per-session state the engine keeps in memory.

    Attributes:
        max_sessions_in_memory: sessions kept at once; the least recently used beyond it go.
        idle_seconds: a session unused this long goes.
        sweep_every_s: how often idle sessions are looked for (the count is kept on every open).
        expire_every_s: how often the session tier expires sessions past their TTL.
        abandon_stream_after_s: a reply stream from which no piece was taken this long is closed
            for its reader, who went away (`chatcache/abandoned_streams.py`): the turn keeps
            what was generated, and its session is free for other threads and processes again.
            A minute is far longer than any live reader pauses between pieces (a UI renders one
            in milliseconds, a slow client's socket buffers seconds), and half the time a turn
            in another process waits for the session before giving up (the lease wait, 120 s),
            so a turn queued behind an abandoned one gets in instead of failing. A reader that
            pauses longer on purpose (a tool run between pieces) needs a larger value.
    """

    max_sessions_in_memory: int = 1000
    idle_seconds: float = 1800.0
    sweep_every_s: float = 30.0
    expire_every_s: float = 300.0
    abandon_stream_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_sessions_in_memory < 1:
            raise ConfigError(f"max_sessions_in_memory must be at least 1, got {self.max_sessions_in_memory}")
        if self.idle_seconds <= 0:
            raise ConfigError(f"idle_seconds must be positive, got {self.idle_seconds}")
        if self.sweep_every_s < 0 or self.expire_every_s < 0:
            raise ConfigError("sweep_every_s and expire_every_s must be >= 0")
        if not self.abandon_stream_after_s > 0:  # also refuses NaN
            raise ConfigError(f"abandon_stream_after_s must be positive, got {self.abandon_stream_after_s}")


class ResidentSessions:
    """The sessions holding state in memory, least recently used first; safe from several threads.

    Args:
        config: the bounds.
        unload: lets go of a session's state everywhere; returns False (and keeps it) while a
            turn holds the session.
        expire: the session tier's expiry.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        config: MemoryConfig,
        unload: Callable[[str], bool],
        expire: Callable[[], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._unload = unload
        self._expire = expire
        self._clock = clock
        self._lock = threading.Lock()
        self._used: OrderedDict[str, float] = OrderedDict()  # session -> last use, oldest first
        now = clock()
        self._next_sweep = now + config.sweep_every_s
        self._next_expiry = now + config.expire_every_s

    def touch(self, session_id: str) -> None:
        """Note that `session_id` is in use now, then let go of the sessions past the bounds."""
        with self._lock:
            now = self._clock()
            self._used[session_id] = now
            self._used.move_to_end(session_id)
            due = []
            while len(self._used) > self.config.max_sessions_in_memory:
                due.append(self._used.popitem(last=False)[0])
            if now >= self._next_sweep:
                self._next_sweep = now + self.config.sweep_every_s
                while self._used and next(iter(self._used.values())) <= now - self.config.idle_seconds:
                    due.append(self._used.popitem(last=False)[0])
            expire = now >= self._next_expiry
            if expire:
                self._next_expiry = now + self.config.expire_every_s
        # Outside the lock: letting go spills KV to disk, and other sessions' turns go on meanwhile.
        busy = [session for session in due if not self._unload(session)]
        with self._lock:
            for session in busy:  # in a turn right now: as good as used now
                self._used.setdefault(session, now)
        if expire:
            self._expire()

    def forget(self, session_id: str) -> None:
        """Stop tracking a session whose state is already gone (it ended or expired)."""
        with self._lock:
            self._used.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._used)


class KeyLocks:
    """One lock per token-tier key: a key's turns must not overlap (the token tier's rule).

    A lock lives while a turn holds it or waits for it, then goes: conversations come and go,
    and their locks must not pile up.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
        self._guard = threading.Lock()

    def get(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock

    def __len__(self) -> int:
        return len(self._locks)

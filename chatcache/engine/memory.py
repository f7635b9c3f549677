"""The engine's memory bound: the sessions whose state this process holds, and letting them go.

Every session with turns holds a `SessionMemory` (its conversation, drift topic and turn-tier
entries) and KV in the token tier. Users leave without saying so, so the engine lets go of
them itself, each time a session is opened: beyond `max_sessions_in_memory` the least recently
used go, and (looked for at most every `sweep_every_s`) those unused for `idle_seconds` go
too. Letting go drops the one object and moves its KV to disk; the session is not ended: its
next turn rebuilds it from the session tier and restores its KV from disk or recomputes it. A
session in a turn is never let go of; it counts as just used. A conversation the caller keeps
(`ChatEngine.complete`) is here only as its KV's key (`CallerKV`), let go of the same way. The
session tier's expiry runs from here too, at most every `expire_every_s` (so a one-turn process
such as `chatcache ask` leaves it to longer-lived ones).

Deliberately no timer thread: an engine without turns keeps what its last turns left, and
nothing runs beside the caller's threads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from dataclasses import dataclass, field

from ..config import MemoryConfig
from ..steering.session_memory import SessionMemory
from ..tiers.conversations import Conversations
from ..tiers.token_tier import TokenTier
from ..tiers.turn_tier import TurnEntries, TurnTierConfig


@dataclass(eq=False)
class CallerKV:
    """A conversation the caller keeps: the caller holds its messages, this process its KV
    (under `key` in the token tier); its `lock` lets one turn at a time use that KV."""

    key: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = 0.0


class ResidentSessions:
    """The sessions (and caller-kept conversations) holding state in memory, least recently used
    first; the one place that creates and drops a `SessionMemory`. Safe from several threads.

    Args:
        config: the bounds.
        conversations: loads a session's conversation from the session tier.
        turn_tier: the settings of each session's turn-tier entries.
        token_tier: where the sessions' KV is; None on a remote model, whose KV is its server's.
        expire: the session tier's expiry (`Sessions.expire`).
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        config: MemoryConfig,
        conversations: Conversations,
        turn_tier: TurnTierConfig,
        token_tier: TokenTier | None,
        expire: Callable[[], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._conversations = conversations
        self._turn_tier = turn_tier
        self._token_tier = token_tier
        self._expire = expire
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, SessionMemory | CallerKV] = OrderedDict()  # by key, least recently used first
        now = clock()
        self._next_sweep = now + config.sweep_every_s
        self._next_expiry = now + config.expire_every_s

    # -- a turn's way in ---------------------------------------------------------------

    @contextmanager
    def hold(self, session_id: str, create: bool) -> Iterator[SessionMemory]:
        """The session's memory with its lock held: one turn at a time, on the copy in memory.

        A memory dropped while this waited for its lock (let go of, or forgotten after a failed
        turn) is not used: a later turn would rebuild another and run beside this one.

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        while True:
            memory = self.open(session_id, create)
            with memory.lock:
                if self._is_held(memory):
                    yield memory
                    return

    def open(self, session_id: str, create: bool) -> SessionMemory:
        """The session's memory, held or rebuilt from the session tier, without its lock (a
        background reader takes it itself); counted as used now.

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        while True:
            held = self._use(session_id)
            if isinstance(held, SessionMemory):
                return held
            if isinstance(held, CallerKV):  # a caller's conversation used the session's id as its KV key
                with held.lock:  # its turn ends first: one turn at a time on a key's KV
                    self._drop(held)
                continue
            # Read outside the lock: other sessions' turns go on while this one reads the database.
            memory = SessionMemory(self._conversations.load(session_id, create), TurnEntries(self._turn_tier), last_used=self._clock())
            with self._lock:
                self._held.setdefault(session_id, memory)  # another thread's, if it came first

    @contextmanager
    def hold_kv(self, key: str) -> Iterator[None]:
        """The KV key of a conversation the caller keeps, with its lock held; counted as used now."""
        while True:
            held = self._use(key)
            if held is None:
                with self._lock:
                    self._held.setdefault(key, CallerKV(key, last_used=self._clock()))
                continue
            with held.lock:
                if self._is_held(held):
                    yield
                    return

    def loaded(self, session_id: str) -> SessionMemory | None:
        """The session's memory if this process holds it; never reads the database, counts no use."""
        with self._lock:
            held = self._held.get(session_id)
        return held if isinstance(held, SessionMemory) else None

    def keys(self) -> list[str]:
        """The keys of every session and caller-kept conversation held now, least recently used first."""
        with self._lock:
            return list(self._held)

    def sessions(self) -> list[SessionMemory]:
        """Every session's memory held now."""
        with self._lock:
            return [held for held in self._held.values() if isinstance(held, SessionMemory)]

    # -- letting go --------------------------------------------------------------------

    def forget(self, session_id: str) -> None:
        """Drop the session's memory (a failed turn's, or one whose record changed): the next
        turn rebuilds it from the session tier. Its KV stays: the token tier reuses what matches."""
        with self._lock:
            self._held.pop(session_id, None)

    def release(self, session_id: str) -> None:
        """Free what a session holds in memory and on disk: it ended, expired or was deleted."""
        self.forget(session_id)
        if self._token_tier is not None:
            self._token_tier.drop(session_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def _use(self, key: str) -> SessionMemory | CallerKV | None:
        """What is held under `key`, marked as used now; then the bounds are applied."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.last_used = self._clock()
                self._held.move_to_end(key)
        if held is not None:
            self._let_go_past_the_bounds()
        return held

    def _is_held(self, held: SessionMemory | CallerKV) -> bool:
        with self._lock:
            return self._held.get(held.key) is held

    def _let_go_past_the_bounds(self) -> None:
        """Let go of the least recently used beyond the count and, at a sweep, the idle ones;
        run the session tier's expiry when it is due."""
        with self._lock:
            now = self._clock()
            due = list(islice(self._held.values(), max(0, len(self._held) - self.config.max_sessions_in_memory)))
            if now >= self._next_sweep:
                self._next_sweep = now + self.config.sweep_every_s
                for held in islice(self._held.values(), len(due), None):  # least recently used first: stop at the first not idle
                    if held.last_used > now - self.config.idle_seconds:
                        break
                    due.append(held)
            expire = now >= self._next_expiry
            if expire:
                self._next_expiry = now + self.config.expire_every_s
        # Outside the lock: letting go spills KV to disk, and other sessions' turns go on meanwhile.
        for held in due:
            self._let_go(held, now)
        if expire:
            self._expire()

    def _let_go(self, held: SessionMemory | CallerKV, now: float) -> None:
        """Drop `held` and move its KV to disk, unless a turn holds it (then it counts as used now)."""
        if not held.lock.acquire(blocking=False):
            with self._lock:
                if self._held.get(held.key) is held:
                    held.last_used = now
                    self._held.move_to_end(held.key)
            return
        try:
            # The KV goes while the memory is still held and locked: a turn arriving now waits
            # for the lock, then finds the memory gone and rebuilds it, so none sees it half gone.
            if self._is_held(held) and self._token_tier is not None:
                self._token_tier.unload(held.key)
            self._drop(held)
        finally:
            held.lock.release()

    def _drop(self, held: SessionMemory | CallerKV) -> None:
        with self._lock:
            if self._held.get(held.key) is held:
                del self._held[held.key]

"""What one session holds in this process's memory, as one object.

Beside its record in the session tier, a session in a turn has its conversation as the prompt
lays it out (with the typed dialogue state), the topic drift judges against, the turn tier's
entries, and its KV, which the token tier keeps under the session's id (one memory budget
across the engines on a model, so the tier holds the KV and its heat; this object holds the
key). They come and go together: the engine's memory bound (`engine/memory.py`) lets go of
this object and its KV, a failed turn drops it so the next turn rebuilds it from the record,
and a copy another process changed since clears what was derived from the old turns.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..tiers.conversations import Conversation
from ..tiers.turn_tier import TurnEntries
from .drift import DriftTopic


@dataclass(eq=False)
class SessionMemory:
    """One session's state in memory; its `lock` lets one turn at a time use it."""

    conversation: Conversation
    entries: TurnEntries  # the turn tier's: what is worth keeping while the topic lasts
    topic: DriftTopic | None = None  # None until drift reads a turn; then resumed from the stored turns
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = 0.0  # monotonic seconds: the memory bound lets the least recently used go first

    @property
    def key(self) -> str:
        """The session's id, which is also its KV's key in the token tier."""
        return self.conversation.id

    def forget_topic(self) -> None:
        """Forget what was derived from turns that are no longer the stored ones (another
        process answered since): the drift topic, resumed from the stored turns next, and the
        turn-tier entries."""
        self.topic = None
        self.entries.clear()

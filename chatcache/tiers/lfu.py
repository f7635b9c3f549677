"""LFU+ eviction: frequency that decays at a latency-dependent rate, plus LRU compensation.

From the design (DSAC): each item's access frequency decays by a factor chosen by its
latency: 0.98 under 5 ms, 0.75 over 100 ms. The design's in-between formula,
`0.92 + 0.06 * (100 - ms) / 95`, gives 0.98 at 5 ms but 0.92 at 100 ms, a jump to 0.75 just
past it; here the factor runs linearly from 0.98 at 5 ms to 0.75 at 100 ms, so it is
continuous. Latency is what it cost to serve the item the last time it was used (for an
answer, the whole lookup; for a session's KV, the turn's time to first token): items that are
slow to serve lose their heat fastest, as in the design. Decay is
applied per `period_s` of wall time, lazily. Recency is added on top so a new item is not
evicted before it had a chance to be used (LRU compensation).

The answer cache and the token tier both choose their victims with this policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key", int, str)

FAST_MS, SLOW_MS = 5.0, 100.0
FAST_DECAY, SLOW_DECAY = 0.98, 0.75


def decay_factor(latency_ms: float) -> float:
    """Per-period decay of an item's frequency, continuous in its latency."""
    if latency_ms <= FAST_MS:
        return FAST_DECAY
    if latency_ms >= SLOW_MS:
        return SLOW_DECAY
    return FAST_DECAY + (SLOW_DECAY - FAST_DECAY) * (latency_ms - FAST_MS) / (SLOW_MS - FAST_MS)


@dataclass
class Heat:
    """An item's decayed access frequency and when it was last used."""

    frequency: float = 1.0
    last_used: float = 0.0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class LfuPlus:
    """Scores items for eviction; the lowest score goes first.

    Attributes:
        period_s: wall time over which one decay factor applies.
        recency_weight: weight of the LRU compensation term.
        recency_half_life_s: how fast that compensation fades.
    """

    period_s: float = 60.0
    recency_weight: float = 1.0
    recency_half_life_s: float = 300.0

    def decayed(self, heat: Heat, now: float) -> float:
        periods = max(0.0, now - heat.last_used) / self.period_s
        decay: float = decay_factor(heat.latency_ms) ** periods  # typeshed: float ** float may be complex
        return heat.frequency * decay

    def touch(self, heat: Heat, now: float, latency_ms: float | None = None) -> None:
        """Record one use: decay what was there, then count this access."""
        heat.frequency = self.decayed(heat, now) + 1.0
        heat.last_used = now
        if latency_ms is not None:
            heat.latency_ms = latency_ms

    def score(self, heat: Heat, now: float) -> float:
        recency = self.recency_weight * math.exp(-math.log(2) * max(0.0, now - heat.last_used) / self.recency_half_life_s)
        return self.decayed(heat, now) + recency

    def victim(self, heats: Mapping[Key, Heat], now: float) -> Key | None:
        candidates = [(self.score(heat, now), key) for key, heat in heats.items()]
        return min(candidates)[1] if candidates else None

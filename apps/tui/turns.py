"""What the cache panel shows about one turn, from a live `Reply` or from a stored reply's meta."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chatcache import Reply


@dataclass(frozen=True)
class TurnRecord:
    """How one turn was served; token counts are None for turns loaded from the record."""

    tier: str
    ttft_s: float
    reused_tokens: int | None = None
    prefilled_tokens: int | None = None
    generated_tokens: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    answer_cache_hit: bool = False
    drift: bool = False
    finish_reason: str = ""
    intent: str | None = None
    confidence: float | None = None
    dialogue_state: str | None = None

    @classmethod
    def from_reply(cls, reply: Reply) -> TurnRecord:
        s = reply.stats
        return cls(
            tier=s.tier,
            ttft_s=s.ttft_s,
            reused_tokens=s.reused_tokens,
            prefilled_tokens=s.prefilled_tokens,
            generated_tokens=s.generated_tokens,
            drafted_tokens=s.drafted_tokens,
            accepted_tokens=s.accepted_tokens,
            answer_cache_hit=s.answer_cache_hit,
            drift=s.drift,
            finish_reason=s.finish_reason,
            intent=reply.intent,
            confidence=reply.confidence,
            dialogue_state=reply.dialogue_state,
        )

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> TurnRecord:
        """A turn of an earlier run, from what the engine records with each reply.

        The record keeps the tier (an answer-cache hit is tier "answer"), finish reason, TTFT,
        intent, drift and dialogue state; token counts are not kept.
        """
        meta = meta or {}
        tier = str(meta.get("tier", "?"))
        return cls(
            tier=tier,
            ttft_s=float(meta.get("ttft_s") or 0.0),
            answer_cache_hit=tier == "answer",
            drift=bool(meta.get("drift", False)),
            finish_reason=str(meta.get("finish_reason", "")),
            intent=meta.get("intent"),
            dialogue_state=meta.get("dialogue_state"),
        )

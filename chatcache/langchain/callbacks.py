"""`CacheStatsHandler`: which cache tier served each model call, seen from LangChain's callbacks.

`CachedChatModel` puts its cache report in each reply's `response_metadata` (tier, reused
and prefilled tokens, TTFT, answer-cache hit) and the token counts in `usage_metadata`; this
handler collects them per call at `on_llm_end`, so it works wherever callbacks reach the
model: a direct call, an LCEL chain, an agent. Calls of other models are recorded with the
tier "unknown" and their usage, if they report one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import ChatGeneration, LLMResult


@dataclass(frozen=True)
class CallStats:
    """How one model call was served."""

    run_id: UUID
    tier: str
    input_tokens: int
    reused_tokens: int
    output_tokens: int
    ttft_s: float | None
    answer_cache_hit: bool
    finish_reason: str | None


@dataclass
class CacheSummary:
    calls: int = 0
    answer_cache_hits: int = 0
    input_tokens: int = 0
    reused_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)

    @property
    def reuse_ratio(self) -> float:
        """Share of prompt tokens that came from a cache instead of being computed."""
        return self.reused_tokens / self.input_tokens if self.input_tokens else 0.0


class CacheStatsHandler(BaseCallbackHandler):
    """Records one `CallStats` per model call; thread-safe (batches run calls in threads)."""

    def __init__(self) -> None:
        self.calls: list[CallStats] = []
        self._lock = threading.Lock()

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> Any:
        for generations in response.generations:
            for generation in generations:
                self._record(run_id, generation)

    def _record(self, run_id: UUID, generation: Any) -> None:
        meta: dict[str, Any] = {}
        usage: dict[str, Any] = {}
        if isinstance(generation, ChatGeneration):
            meta = dict(generation.message.response_metadata or {})
            usage = dict(getattr(generation.message, "usage_metadata", None) or {})
        details = usage.get("input_token_details") or {}
        call = CallStats(
            run_id=run_id,
            tier=str(meta.get("tier", "unknown")),
            input_tokens=int(usage.get("input_tokens", 0)),
            reused_tokens=int(meta.get("reused_tokens", details.get("cache_read", 0))),
            output_tokens=int(usage.get("output_tokens", 0)),
            ttft_s=meta.get("ttft_s"),
            answer_cache_hit=bool(meta.get("answer_cache_hit", False)),
            finish_reason=meta.get("finish_reason"),
        )
        with self._lock:
            self.calls.append(call)

    def summary(self) -> CacheSummary:
        with self._lock:
            calls = list(self.calls)
        summary = CacheSummary(calls=len(calls))
        for call in calls:
            summary.answer_cache_hits += call.answer_cache_hit
            summary.input_tokens += call.input_tokens
            summary.reused_tokens += call.reused_tokens
            summary.tiers[call.tier] = summary.tiers.get(call.tier, 0) + 1
        return summary

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()

"""What a turn returns: the reply text, its token ids and how the cache served it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TurnStats:
    """How one turn was served.

    Attributes:
        prompt_tokens: tokens the model had to have seen before replying.
        reused_tokens: of those, how many came from a cache (no compute).
        prefilled_tokens: of those, how many were computed this turn.
        generated_tokens: reply tokens.
        ttft_s: seconds from the call to the first reply token.
        total_s: seconds for the whole turn.
        decode_tokens_per_s: reply tokens per second after the first.
        tier: which cache served the prompt: "session" (memory), "disk" (spilled and restored),
            "prefix" (shared system prompt only), "none" (computed from scratch) or "dialog"
            (the bot's flow asked for a slot or a confirmation; the model did not run).
        dropped_turns: earlier turns left out of the prompt (to fit the context window, or
            because the topic changed).
        kv_bytes: KV bytes the token tier holds in memory after the turn.
        mean_entropy_bits: mean entropy of the token distributions the reply was drawn from.
        finish_reason: "eos", "length", "stop" (a stop sequence), "cancelled" or "flow".
        answer_cache_hit: whether the answer came from the answer cache without the model.
        drift: whether this turn was detected as a topic change.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    tier: str = "none"
    dropped_turns: int = 0
    kv_bytes: int = 0
    mean_entropy_bits: float = 0.0
    finish_reason: str = "eos"
    answer_cache_hit: bool = False
    drift: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reply:
    """One answer: the text shown to the user and the ids the model generated."""

    session_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    stats: TurnStats = field(default_factory=TurnStats)
    intent: str | None = None
    confidence: float | None = None
    dialogue_state: str | None = None


class ReplyStream:
    """Text pieces of a reply as they are generated; `reply` is set once the stream ends.

    Closing the stream early (or breaking out of the loop and dropping it) cancels the
    generation; what was generated so far is kept as the reply.
    """

    def __init__(self, pieces: Iterator[str], finished: Callable[[], Reply | None]) -> None:
        self._pieces = pieces
        self._finished = finished

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    @property
    def reply(self) -> Reply | None:
        """The finished reply, or None while the stream is still running."""
        return self._finished()

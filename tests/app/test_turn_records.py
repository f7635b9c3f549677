"""The cache panel's record of a turn from an earlier run matches what the engine said at the time."""

from __future__ import annotations

from chatcache.apps.tui.turns import TurnRecord


def test_a_stored_turn_shows_how_it_was_served(engine) -> None:  # type: ignore[no-untyped-def]
    reply = engine.chat("s", "Hello there", max_new_tokens=4)
    stored = TurnRecord.from_meta(engine.sessions.records("s")[-1].meta)
    live = TurnRecord.from_reply(reply)
    for name in ("tier", "drift", "finish_reason", "intent", "dialogue_state", "answer_cache_hit"):
        assert getattr(stored, name) == getattr(live, name), name
    assert stored.ttft_s == live.ttft_s
    served = TurnRecord.from_meta({**engine.sessions.records("s")[-1].meta, "tier": "answer"})
    assert served.answer_cache_hit  # the record has no flag of its own: an answer-cache turn is tier "answer"

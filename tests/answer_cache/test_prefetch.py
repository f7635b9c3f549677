"""ACPC: the likely next question is answered in the background, only while the engine is idle."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chatcache import TokenTierConfig
from chatcache.answer_cache.prefetch import Prefetcher, TransitionModel


def test_transition_model_predicts_frequent_followers_only() -> None:
    model = TransitionModel(min_count=2, min_probability=0.3)
    for _ in range(3):
        model.learn([("What are your opening hours?", None), ("Where is the nearest branch?", None)])
    model.learn([("What are your opening hours?", None), ("Do you sell gold?", None)])
    predictions = model.predict("what are your opening hours", None)
    assert [p.question for p in predictions] == ["Where is the nearest branch?"]
    assert predictions[0].probability == pytest.approx(0.75)
    assert model.predict("Do you sell gold?", None) == []


def test_intents_are_states_so_any_wording_predicts() -> None:
    model = TransitionModel(min_count=1)
    model.learn([("I lost my card", "report_lost_card"), ("When do you open?", "opening_hours")])
    model.learn([("my card was stolen", "report_lost_card"), ("When do you open?", "opening_hours")])
    assert [p.question for p in model.predict("card is gone", "report_lost_card")] == ["When do you open?"]


def test_prefetch_waits_while_busy_and_stops_when_a_turn_arrives() -> None:
    busy = threading.Event()
    busy.set()
    ran: list[str] = []
    stopped: list[bool] = []

    def answer(session_id: str, question: str, should_stop) -> bool:  # type: ignore[no-untyped-def]
        ran.append(question)
        busy.set()  # a user turn arrives while the prefetch runs
        stopped.append(should_stop())
        return False

    model = TransitionModel(min_count=1)
    model.learn([("a", None), ("b", None)])
    prefetcher = Prefetcher(model, answer, busy.is_set, idle_wait_s=0.01)
    prefetcher.after_turn("s", [("a", None)])
    time.sleep(0.2)
    assert ran == []  # busy: nothing ran
    busy.clear()
    assert prefetcher.wait_idle(5)
    assert ran == ["b"] and stopped == [True] and prefetcher.cancelled == 1
    prefetcher.close()


def test_a_prefetched_answer_is_served_and_equals_the_models(make_engine, tiny_model, toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """End to end: the next-question model learns from the stored conversations, the background
    thread answers the predicted question after a turn, and the next turn is served that answer,
    which is the model's own."""
    from chatcache import AnswerCacheConfig

    url = f"sqlite:///{tmp_path}/bank.db"
    first, then = "What are your opening hours?", "ok"
    history = make_engine(tiny_model, store=url)
    for session in ("h1", "h2"):
        history.chat(session, first, max_new_tokens=6)
        history.chat(session, then, max_new_tokens=6)
    engine = make_engine(
        tiny_model, store=url, embedder=toy_embed, prefetch=True, token_tier=TokenTierConfig(spill_dir=None),
        answer_cache=AnswerCacheConfig(max_entropy_bits=99.0),  # the random model's answers are all uncertain
    )  # fmt: skip
    engine.chat("new", first, max_new_tokens=6)
    deadline = time.monotonic() + 60  # the background thread's answer shows in the cache's counts
    while engine.answer_cache.snapshot().prefetched_entries < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    served = engine.chat("new", then, max_new_tokens=256)
    assert served.stats.answer_cache_hit
    stats = engine.answer_cache.snapshot()
    assert stats.prefetched_entries >= 1 and stats.prefetched_hits == 1
    uncached = make_engine(tiny_model)
    uncached.chat("new", first, max_new_tokens=6)
    assert served.text == uncached.chat("new", then, max_new_tokens=256).text
    engine.close()


def test_a_prefetch_is_the_next_turns_answer_and_leaves_the_session_as_it_is(make_engine, tiny_model, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """Prefetch runs the turn's own steps (its scope, its prompt layout, the model on a copy of
    the session's KV): the answer it stores is what the model says on that turn, and the session
    keeps its window, rendered segments and KV, so a turn that asks something else goes on as
    without it."""
    from chatcache import AnswerCacheConfig

    cached = make_engine(
        tiny_model, answer_cache=AnswerCacheConfig(max_entropy_bits=99.0), embedder=toy_embed,
        token_tier=TokenTierConfig(spill_dir=None),
    )  # fmt: skip
    plain = make_engine(tiny_model, token_tier=TokenTierConfig(spill_dir=None))
    question = "ok"
    for session, opening in (("asks", "hello there"), ("moves on", "good morning")):
        for engine in (cached, plain):
            engine.chat(session, opening, max_new_tokens=6)
        conversation = cached.sessions.open(session, create=False).conversation
        window, segments = conversation.context_start, [list(ids) for ids in conversation.segments.ids]
        assert cached.turns.prefetch(session, question, lambda: False), "the tiny model ends this answer: it is stored"
        assert (conversation.context_start, conversation.segments.ids) == (window, segments)
    served, fresh = (engine.chat("asks", question, max_new_tokens=256) for engine in (cached, plain))
    assert served.stats.answer_cache_hit and not fresh.stats.answer_cache_hit
    assert served.text == fresh.text
    other, other_plain = (engine.chat("moves on", "and then", max_new_tokens=6) for engine in (cached, plain))
    assert not other.stats.answer_cache_hit and other.token_ids == other_plain.token_ids
    assert other.stats.reused_tokens == other_plain.stats.reused_tokens > 0

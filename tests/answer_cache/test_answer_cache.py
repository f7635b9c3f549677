"""The answer cache serves only what was stored for an equivalent question in the same scope."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, LfuPlus, Scope, decay_factor
from chatcache.tiers.lfu import Heat
from chatcache.errors import ConfigError
from chatcache.storage import SessionStore

BOT = Scope("model@1", "bot-a")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def cache(toy_embed, **config) -> AnswerCache:  # type: ignore[no-untyped-def]
    return AnswerCache(AnswerCacheConfig(**config), toy_embed)


def test_exact_and_semantic_hits_within_a_scope(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed, similarity_threshold=0.7)
    assert answers.store("What are your opening hours?", "9 to 5", BOT, entropy_bits=1.0, latency_ms=300)
    exact = answers.lookup("  what are your OPENING hours ", BOT)
    assert exact is not None and exact.exact and exact.answer == "9 to 5"
    near = answers.lookup("what are your opening hours today", BOT)
    assert near is not None and not near.exact and near.similarity >= 0.7
    assert answers.lookup("how do I reset my password", BOT) is None


def test_knows_tells_a_question_no_scope_holds_from_one_some_scope_does(toy_embed) -> None:  # type: ignore[no-untyped-def]
    """Admission's door: a text no scope holds surely has no exact hit; one held anywhere may."""
    answers = cache(toy_embed)
    assert not answers.knows("What are your opening hours?")
    answers.store("What are your opening hours?", "9 to 5", Scope("model@1", "bot-b"), entropy_bits=1.0, latency_ms=300)
    assert answers.knows("  what are your OPENING hours ") and not answers.knows("what are your opening hours today")
    assert answers.lookup("What are your opening hours?", BOT) is None  # known, yet not in this scope


def test_an_entry_never_crosses_a_scope(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed)
    answers.store("How old is he?", "He is 52.", Scope("m", "b", context="ctx:obama"), 1.0, 100)
    for other in (
        Scope("m", "b", context="ctx:merkel"),  # another conversation's context
        Scope("m", "b", tenant="other-tenant", context="ctx:obama"),
        Scope("m", "other-bot", context="ctx:obama"),
        Scope("other-model", "b", context="ctx:obama"),
    ):
        assert answers.lookup("How old is he?", other) is None
    assert answers.lookup("How old is he?", Scope("m", "b", context="ctx:obama")) is not None


def test_verification_refuses_near_duplicates_that_mean_something_else(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed, similarity_threshold=0.3)
    answers.store("Transfer 200 dollars to savings", "Done: 200.", BOT, 1.0, 100)
    answers.store("What is the function of money?", "A medium of exchange.", BOT, 1.0, 100)
    assert answers.lookup("Transfer 300 dollars to savings", BOT) is None
    assert answers.lookup("What is the function of TV?", BOT) is None
    stats = answers.snapshot()
    assert stats.refused_by_verification == 2
    unverified = cache(toy_embed, similarity_threshold=0.3, verify=False)
    unverified.store("Transfer 200 dollars to savings", "Done: 200.", BOT, 1.0, 100)
    assert unverified.lookup("Transfer 300 dollars to savings", BOT) is not None  # what verification prevents


def test_a_question_between_two_answers_gets_neither(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed, similarity_threshold=0.3, margin=0.05, verify=False)
    answers.store("card arrival time", "card_arrival", BOT, 1.0, 100)
    answers.store("card delivery time", "card_delivery", BOT, 1.0, 100)
    assert answers.lookup("card time", BOT) is None
    assert answers.snapshot().refused_as_ambiguous == 1


def test_high_entropy_empty_and_duplicate_answers_are_not_stored(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed, max_entropy_bits=5.2)
    assert not answers.store("What is love?", "Who knows", BOT, entropy_bits=6.0, latency_ms=100)
    assert not answers.store("   ", "an answer", BOT, 1.0, 100)
    assert not answers.store("a question", "  ", BOT, 1.0, 100)
    assert answers.store("a question", "an answer", BOT, 1.0, 100)
    assert not answers.store("A question!", "another answer", BOT, 1.0, 100)
    stats = answers.snapshot()
    assert stats.refused_high_entropy == 1 and stats.entries == 1
    assert answers.lookup("   ", BOT) is None


def test_very_long_questions_are_truncated_for_the_key_only(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed)
    long_question = "please explain " + "the weather " * 1000
    assert answers.store(long_question, "sunny", BOT, 1.0, 100)
    hit = answers.lookup(long_question, BOT)
    assert hit is not None and hit.question == long_question


def test_absolute_and_sliding_ttl(toy_embed) -> None:  # type: ignore[no-untyped-def]
    for sliding in (False, True):
        clock = Clock()
        answers = AnswerCache(AnswerCacheConfig(ttl_s=100, sliding_ttl=sliding), toy_embed, clock=clock)
        answers.store("opening hours", "9 to 5", BOT, 1.0, 100)
        clock.now += timedelta(seconds=80)
        assert answers.lookup("opening hours", BOT) is not None
        clock.now += timedelta(seconds=40)  # 120 s after storing, 40 s after the hit
        assert (answers.lookup("opening hours", BOT) is not None) is sliding


def test_entries_persist_in_the_session_database_and_are_reindexed(toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/answers.db"
    with SessionStore(url) as store:
        AnswerCache(AnswerCacheConfig(similarity_threshold=0.7), toy_embed, store.answers).store(
            "What are your opening hours?", "9 to 5", BOT, 1.0, 100
        )
    with SessionStore(url) as store:
        reloaded = AnswerCache(AnswerCacheConfig(similarity_threshold=0.7), toy_embed, store.answers)
        hit = reloaded.lookup("what are your opening hours today", BOT)
        assert hit is not None and hit.answer == "9 to 5" and not hit.exact


def test_a_corrupted_stored_embedding_is_dropped_not_served(toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path}/answers.db"
    with SessionStore(url) as store:
        answers = AnswerCache(AnswerCacheConfig(), toy_embed, store.answers)
        answers.store("opening hours", "9 to 5", BOT, 1.0, 100)
        answers.store("closing time", "at 5", BOT, 1.0, 100)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE answer_entries SET embedding = :b WHERE normalized = 'opening hours'"), {"b": b"junk"})
    engine.dispose()
    with SessionStore(url) as store:
        reloaded = AnswerCache(AnswerCacheConfig(), toy_embed, store.answers)
        assert reloaded.lookup("opening hours", BOT) is None
        assert reloaded.lookup("closing time", BOT) is not None
        assert len(store.answers.all()) == 1


def test_capacity_by_count_and_bytes_evicts_the_coldest(toy_embed) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    answers = AnswerCache(AnswerCacheConfig(max_entries=2), toy_embed, clock=clock)
    answers.store("alpha question", "a", BOT, 1.0, 100)
    answers.store("beta question", "b", BOT, 1.0, 100)
    for _ in range(3):
        assert answers.lookup("alpha question", BOT) is not None  # alpha is hot
    clock.now += timedelta(seconds=1)
    answers.store("gamma question", "c", BOT, 1.0, 100)
    assert answers.lookup("beta question", BOT) is None and answers.lookup("alpha question", BOT) is not None
    assert answers.snapshot().evictions == 1
    small = AnswerCache(AnswerCacheConfig(max_bytes=6000), toy_embed, clock=clock)
    for word in ("one", "two", "three", "four"):
        small.store(f"question {word}", "x" * 1000, BOT, 1.0, 100)
    stats = small.snapshot()
    assert stats.bytes <= 6000 and stats.evictions >= 1


def test_a_smaller_capacity_at_reload_evicts_the_surplus_from_memory_and_database(toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/answers.db"
    with SessionStore(url) as store:
        answers = AnswerCache(AnswerCacheConfig(), toy_embed, store.answers)
        for word in ("one", "two", "three", "four"):
            answers.store(f"question {word}", word, BOT, 1.0, 100)
    with SessionStore(url) as store:
        reloaded = AnswerCache(AnswerCacheConfig(max_entries=2), toy_embed, store.answers)
        assert reloaded.snapshot().entries == 2 and reloaded.snapshot().evictions == 2
        assert len(store.answers.all()) == 2


def test_expired_entries_leave_with_their_scopes(toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    with SessionStore(f"sqlite:///{tmp_path}/answers.db") as store:
        answers = AnswerCache(AnswerCacheConfig(ttl_s=10), toy_embed, store.answers, clock=clock)
        follow_up = Scope("model@1", "bot-a", context="after: opening hours")
        answers.store("opening hours", "9 to 5", BOT, 1.0, 100)
        answers.store("and on sunday", "closed", follow_up, 1.0, 100)
        answers.store("and on monday", "9 to 5", follow_up, 1.0, 100)
        clock.now += timedelta(seconds=11)
        assert answers.purge_expired() == 3
        assert store.answers.all() == []
        # Follow-up scopes are one per conversation turn: an emptied one must not linger.
        assert answers.snapshot().scopes == 0
        assert answers.lookup("and on sunday", follow_up) is None


def test_latency_aware_decay_is_continuous_between_the_design_endpoints() -> None:
    assert decay_factor(0) == decay_factor(5) == 0.98
    assert decay_factor(100) == decay_factor(1000) == 0.75
    grid = np.linspace(0, 120, 1201)
    values = np.array([decay_factor(x) for x in grid])
    assert np.all(np.diff(values) <= 0) and np.max(np.abs(np.diff(values))) < 0.01


def test_lfu_plus_prefers_frequent_items_and_compensates_recency() -> None:
    policy = LfuPlus(period_s=60, recency_weight=1.0, recency_half_life_s=60)
    hot, cold, fresh = Heat(), Heat(), Heat()
    for t in (0, 1, 2, 3):
        policy.touch(hot, t)
    policy.touch(cold, 0)
    policy.touch(fresh, 600)
    heats = {"hot": hot, "cold": cold, "fresh": fresh}
    assert policy.victim(heats, now=600) == "cold"
    slow = Heat(latency_ms=500)
    fast = Heat(latency_ms=1)
    policy.touch(slow, 0, latency_ms=500)
    policy.touch(fast, 0, latency_ms=1)
    assert policy.decayed(slow, 600) < policy.decayed(fast, 600)


def test_concurrent_lookups_and_stores_are_safe(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(200):
                answers.store(f"worker {worker} question {i}", f"answer {worker}-{i}", BOT, 1.0, 10)
                hit = answers.lookup(f"worker {worker} question {i}", BOT)
                assert hit is not None and hit.answer == f"answer {worker}-{i}"
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = answers.snapshot()
    assert stats.entries == 1200 and stats.hits >= 1200


def test_thresholds_are_cosine_and_zero_is_valid() -> None:
    assert AnswerCacheConfig(similarity_threshold=0.0).similarity_threshold == 0.0
    with pytest.raises(ConfigError, match="cosine"):
        AnswerCacheConfig(similarity_threshold=1.5)


def test_replace_overwrites_the_entry_of_the_same_question(toy_embed) -> None:  # type: ignore[no-untyped-def]
    answers = cache(toy_embed)
    answers.store("opening hours", "9 to 5", BOT, 1.0, 100)
    assert not answers.store("opening hours", "10 to 6", BOT, 1.0, 100)
    assert answers.lookup("opening hours", BOT).answer == "9 to 5"  # type: ignore[union-attr]
    assert answers.store("opening hours", "10 to 6", BOT, 1.0, 100, overwrite=True)
    assert answers.lookup("opening hours", BOT).answer == "10 to 6"  # type: ignore[union-attr]
    assert answers.snapshot().entries == 1


def test_a_hit_records_what_the_whole_lookup_cost_as_the_entrys_latency() -> None:
    import time as clock_time

    def slow_embed(texts: list[str]) -> np.ndarray:
        clock_time.sleep(0.05)  # an embedder this slow makes every semantic serve cost >= 50 ms
        rows = np.zeros((len(texts), 8), dtype=np.float32)
        rows[:, 0] = 1.0
        return rows

    answers = AnswerCache(AnswerCacheConfig(verify=False), slow_embed)
    answers.store("opening hours", "9 to 5", BOT, 1.0, 100, embedding=slow_embed(["x"])[0])
    assert answers.lookup("when do you open", BOT) is not None
    (entry,) = answers._entries.values()  # private: an entry's heat is the cache's own eviction state, shown nowhere
    assert entry.heat.latency_ms >= 50

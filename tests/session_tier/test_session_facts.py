"""Remembering intents, slots and preferences, one per (session, kind, name)."""

from __future__ import annotations

import pytest

from chatcache.storage import Fact, FactKind, SessionClosedError, SessionStore, UnknownSessionError
from tests.session_tier.fake_clock import START, FakeClock


def test_a_fact_reads_back(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    fact = store.upsert_fact("s1", "slot", "destination", "Lyon", 0.8, source_turn=2)

    assert fact == Fact(
        id=fact.id,
        session_id="s1",
        kind=FactKind.SLOT,
        name="destination",
        value="Lyon",
        confidence=0.8,
        source_turn=2,
        created_at=START,
    )
    assert store.facts("s1") == [fact]


def test_a_newer_fact_replaces_the_old_one(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s1", "ada", "travel")
    old = store.upsert_fact("s1", "slot", "destination", "Lyon", 0.6, source_turn=2)
    later = clock.advance(minutes=3)

    new = store.upsert_fact("s1", FactKind.SLOT, "destination", "Lille", 0.9, source_turn=5)

    assert store.facts("s1") == [new]
    assert (new.id, new.value, new.confidence, new.source_turn, new.created_at) == (
        old.id,
        "Lille",
        0.9,
        5,
        later,
    )


def test_kind_and_name_together_identify_a_fact(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    store.create_session("s2", "ada", "travel")
    store.upsert_fact("s1", "slot", "city", "Lyon", 0.9, 1)
    store.upsert_fact("s1", "preference", "city", "Paris", 0.5, 1)
    store.upsert_fact("s1", "intent", "book_train", "yes", 0.99, 1)
    store.upsert_fact("s2", "slot", "city", "Nice", 0.9, 1)

    facts = store.facts("s1")

    assert [(f.kind, f.name, f.value) for f in facts] == [
        (FactKind.INTENT, "book_train", "yes"),
        (FactKind.PREFERENCE, "city", "Paris"),
        (FactKind.SLOT, "city", "Lyon"),
    ]
    assert [f.value for f in store.facts("s2")] == ["Nice"]


def test_upserting_is_activity(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s1", "ada", "travel")
    later = clock.advance(hours=1)

    store.upsert_fact("s1", "intent", "book_train", "yes", 0.9, 1)

    assert store.get_session("s1").expires_at == later + store.ttl


@pytest.mark.parametrize(("kind", "confidence"), [("mood", 0.5), ("slot", 1.5), ("slot", -0.1)])
def test_invalid_facts_are_rejected(store: SessionStore, kind: str, confidence: float) -> None:
    store.create_session("s1", "ada", "travel")

    with pytest.raises(ValueError):
        store.upsert_fact("s1", kind, "city", "Lyon", confidence, 1)
    assert store.facts("s1") == []


def test_facts_of_unknown_or_closed_sessions_raise(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    store.end_session("s1")

    with pytest.raises(UnknownSessionError):
        store.facts("nope")
    with pytest.raises(SessionClosedError):
        store.upsert_fact("s1", "slot", "city", "Lyon", 0.9, 1)

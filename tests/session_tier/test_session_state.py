"""Dialogue state updates with optimistic locking: a stale write never wins."""

from __future__ import annotations

import pytest

from chatcache.storage import SessionClosedError, SessionStore, StaleVersionError, UnknownSessionError
from tests.session_tier.fake_clock import FakeClock


def test_update_replaces_the_state_and_bumps_the_version(
    store: SessionStore, clock: FakeClock
) -> None:
    session = store.create_session("s1", "ada", "travel")
    later = clock.advance(minutes=10)

    updated = store.update_state(
        "s1", {"flow": "booking", "slots": {"to": "Lyon"}}, session.version
    )

    assert updated.state == {"flow": "booking", "slots": {"to": "Lyon"}}
    assert updated.version == session.version + 1
    assert (updated.updated_at, updated.expires_at) == (later, later + store.ttl)
    assert store.get_session("s1") == updated


def test_a_stale_write_raises_and_leaves_the_winner_in_place(store: SessionStore) -> None:
    session = store.create_session("s1", "ada", "travel")
    # Two turns read version 1; the first one to write wins.
    winner = store.update_state("s1", {"step": "ask_date"}, session.version)

    with pytest.raises(StaleVersionError, match="version 2, not 1") as caught:
        store.update_state("s1", {"step": "ask_city"}, session.version)

    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert store.get_session("s1") == winner


def test_a_retry_after_rereading_succeeds(store: SessionStore) -> None:
    session = store.create_session("s1", "ada", "travel")
    store.update_state("s1", {"step": "ask_date"}, session.version)
    with pytest.raises(StaleVersionError):
        store.update_state("s1", {"step": "ask_city"}, session.version)

    fresh = store.get_session("s1")
    retried = store.update_state("s1", {**fresh.state, "city": "Lyon"}, fresh.version)

    assert retried.state == {"step": "ask_date", "city": "Lyon"}
    assert retried.version == 3


def test_state_of_unknown_or_ended_sessions_cannot_change(store: SessionStore) -> None:
    session = store.create_session("s1", "ada", "travel")
    store.end_session("s1")

    with pytest.raises(SessionClosedError):
        store.update_state("s1", {"step": "x"}, session.version)
    with pytest.raises(UnknownSessionError):
        store.update_state("nope", {}, 1)
    assert store.get_session("s1").state == {}

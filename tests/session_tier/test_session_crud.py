"""Creating, reading, listing, renaming, ending and deleting sessions."""

from __future__ import annotations

import dataclasses

import pytest

from chatcache.storage import (
    ChatSession,
    SessionExistsError,
    SessionStatus,
    SessionStore,
    UnknownSessionError,
)
from tests.session_tier.fake_clock import START, FakeClock


def test_created_session_is_active_at_version_one_and_reads_back(store: SessionStore) -> None:
    created = store.create_session("s1", "ada", "travel", title="Lyon trip")

    assert created == ChatSession(
        id="s1",
        user_id="ada",
        bot="travel",
        title="Lyon trip",
        status=SessionStatus.ACTIVE,
        version=1,
        state={},
        created_at=START,
        updated_at=START,
        expires_at=START + store.ttl,
    )
    assert store.get_session("s1") == created


def test_session_records_are_frozen_and_outlive_the_store(store: SessionStore) -> None:
    session = store.create_session("s1", "ada", "travel")
    store.close()

    assert session.bot == "travel"
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.title = "changed"  # type: ignore[misc]


def test_creating_a_taken_id_raises(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    with pytest.raises(SessionExistsError, match="s1"):
        store.create_session("s1", "bob", "travel")
    assert store.get_session("s1").user_id == "ada"


def test_unknown_session_error_names_the_id_and_is_a_key_error(store: SessionStore) -> None:
    with pytest.raises(UnknownSessionError, match="unknown session 'nope'") as caught:
        store.get_session("nope")
    assert isinstance(caught.value, KeyError)


def test_get_or_create_creates_once_then_returns_the_same_session(store: SessionStore) -> None:
    first = store.get_or_create_session("s1", "ada", "travel")
    store.append_message("s1", "user", "hi", 1)
    again = store.get_or_create_session("s1", "ada", "travel")

    assert again.created_at == first.created_at
    assert store.count_sessions() == 1
    assert len(store.messages("s1")) == 1


def test_ensure_session_says_which_call_created_it_also_when_threads_race(store: SessionStore) -> None:
    import threading

    results: list[bool] = []
    start = threading.Barrier(8)

    def ensure() -> None:
        start.wait()
        results.append(store.ensure_session("raced", "ada", "travel")[1])

    threads = [threading.Thread(target=ensure) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]  # exactly one call created it
    assert store.ensure_session("raced", "ada", "travel")[1] is False and store.count_sessions() == 1


def test_get_or_create_refuses_another_users_session(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    with pytest.raises(SessionExistsError, match="another user"):
        store.get_or_create_session("s1", "mallory", "travel")


def test_list_sessions_orders_by_latest_activity_and_filters(
    store: SessionStore, clock: FakeClock
) -> None:
    for session_id in ("a", "b", "c"):
        store.create_session(session_id, "ada", "travel")
        clock.advance(minutes=1)
    store.create_session("other", "bob", "travel")
    clock.advance(minutes=1)
    store.append_message("a", "user", "back again", 2)  # activity moves "a" to the top
    store.end_session("b")

    assert [s.id for s in store.list_sessions(user_id="ada")] == ["a", "b", "c"]
    assert [s.id for s in store.list_sessions()] == ["a", "b", "other", "c"]
    assert [s.id for s in store.list_sessions(status="active", user_id="ada")] == ["a", "c"]
    assert [s.id for s in store.list_sessions(limit=2)] == ["a", "b"]
    assert store.count_sessions() == 4
    assert store.count_sessions(status=SessionStatus.ENDED) == 1
    assert store.count_sessions(user_id="bob") == 1


def test_rename_changes_only_the_title(store: SessionStore, clock: FakeClock) -> None:
    before = store.create_session("s1", "ada", "travel")
    clock.advance(hours=1)

    renamed = store.rename_session("s1", "Weekend in Lyon")

    assert renamed == dataclasses.replace(before, title="Weekend in Lyon")
    assert store.get_session("s1") == renamed
    assert store.rename_session("s1", None).title is None


def test_end_session_marks_it_ended(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s1", "ada", "travel")
    clock.advance(minutes=5)

    ended = store.end_session("s1")

    assert ended.status is SessionStatus.ENDED
    assert ended.updated_at == clock.now
    assert store.get_session("s1").status is SessionStatus.ENDED


def test_delete_removes_the_session_and_cascades_to_messages_and_facts(
    store: SessionStore,
) -> None:
    store.create_session("gone", "ada", "travel")
    store.create_session("kept", "ada", "travel")
    for session_id in ("gone", "kept"):
        store.append_message(session_id, "user", "hello", 1)
        store.upsert_fact(session_id, "slot", "city", "Lyon", 0.9, 1)

    store.delete_session("gone")

    with pytest.raises(UnknownSessionError):
        store.get_session("gone")
    # Rows are counted directly: the store's own reads would fail on the missing session.
    with store._db.transaction() as db:  # noqa: SLF001
        orphans = (
            db.connection()
            .exec_driver_sql(
                "SELECT (SELECT count(*) FROM messages WHERE session_id = 'gone'),"
                " (SELECT count(*) FROM session_facts WHERE session_id = 'gone')"
            )
            .one()
        )
    assert tuple(orphans) == (0, 0)
    assert len(store.messages("kept")) == 1
    assert len(store.facts("kept")) == 1


@pytest.mark.parametrize("method", ["rename_session", "end_session", "delete_session"])
def test_changing_an_unknown_session_raises(store: SessionStore, method: str) -> None:
    args = ("nope", "title") if method == "rename_session" else ("nope",)

    with pytest.raises(UnknownSessionError, match="nope"):
        getattr(store, method)(*args)

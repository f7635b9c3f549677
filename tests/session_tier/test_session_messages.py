"""Appending messages and reading a session's history back in order."""

from __future__ import annotations

import pytest

from chatcache.storage import Message, Role, SessionClosedError, SessionStore, UnknownSessionError
from tests.session_tier.fake_clock import START, FakeClock


def test_appended_messages_are_numbered_and_read_back_in_order(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    first = store.append_message("s1", "system", "You book trains.", 4)
    second = store.append_message("s1", Role.USER, "To Lyon, please", 5, meta={"lang": "en"})
    third = store.append_message("s1", "assistant", "Which day?", 3)

    assert [m.seq for m in (first, second, third)] == [1, 2, 3]
    assert second == Message(
        id=second.id,
        session_id="s1",
        seq=2,
        role=Role.USER,
        content="To Lyon, please",
        token_count=5,
        created_at=START,
        meta={"lang": "en"},
    )
    assert store.messages("s1") == [first, second, third]


def test_limit_returns_the_latest_messages_oldest_first(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    for turn in range(1, 8):
        store.append_message("s1", "user", f"turn {turn}", 2)

    assert [m.content for m in store.messages("s1", limit=3)] == ["turn 5", "turn 6", "turn 7"]
    assert store.messages("s1", limit=0) == []
    assert len(store.messages("s1", limit=100)) == 7


def test_numbering_is_per_session(store: SessionStore) -> None:
    store.create_session("a", "ada", "travel")
    store.create_session("b", "ada", "travel")
    store.append_message("a", "user", "one", 1)
    store.append_message("a", "user", "two", 1)

    assert store.append_message("b", "user", "first in b", 3).seq == 1


def test_a_new_session_has_no_messages_and_an_unknown_one_raises(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    assert store.messages("s1") == []
    with pytest.raises(UnknownSessionError, match="nope"):
        store.messages("nope")
    with pytest.raises(UnknownSessionError, match="nope"):
        store.append_message("nope", "user", "hello?", 2)


def test_appending_to_an_ended_session_raises_and_writes_nothing(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    ended = store.end_session("s1")

    with pytest.raises(SessionClosedError, match="ended"):
        store.append_message("s1", "user", "still there?", 3)
    assert store.messages("s1") == []
    assert store.get_session("s1") == ended


def test_an_unknown_role_is_rejected(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")

    with pytest.raises(ValueError, match="robot"):
        store.append_message("s1", "robot", "beep", 1)
    assert store.messages("s1") == []


def test_appending_is_activity(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s1", "ada", "travel")
    later = clock.advance(hours=2)

    store.append_message("s1", "user", "hello", 1)

    session = store.get_session("s1")
    assert session.updated_at == later
    assert session.expires_at == later + store.ttl


def test_a_withdrawn_user_message_is_gone_and_its_seq_is_given_again(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    store.append_message("s1", "user", "To Lyon, please", 5)
    store.append_message("s1", "assistant", "Which day?", 3, reply_to=1)
    refused = store.append_message("s1", "user", "Tomorrow", 2)

    store.withdraw_message("s1", refused.seq)

    assert [m.content for m in store.messages("s1")] == ["To Lyon, please", "Which day?"]
    assert store.append_message("s1", "user", "Tomorrow", 2).seq == refused.seq


def test_only_the_last_unanswered_user_message_can_be_withdrawn(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    store.append_message("s1", "user", "To Lyon, please", 5)
    store.append_message("s1", "assistant", "Which day?", 3, reply_to=1)

    with pytest.raises(ValueError, match="not its last message, a user's"):
        store.withdraw_message("s1", 2)  # the bot's reply
    with pytest.raises(ValueError, match="not its last message, a user's"):
        store.withdraw_message("s1", 1)  # answered, and not the last
    with pytest.raises(UnknownSessionError):
        store.withdraw_message("nobody", 1)
    assert len(store.messages("s1")) == 2

"""Ids and text one backend would refuse are refused alike on every backend, before any write.

PostgreSQL refuses a NUL in text and an id over its `VARCHAR(128)`; SQLite would store both.
No driver can encode a lone surrogate. Each case must end in the store's own error, with
nothing written, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatcache.storage import InvalidIdError, InvalidTextError, SessionStore

BAD_IDS = {
    "empty": ("", "is empty"),
    "over 128 characters": ("x" * 129, "is 129 characters long"),
    "NUL": ("a\x00b", "control character"),
    "newline": ("a\nb", "control character"),
    "escape": ("a\x1bb", "control character"),
    "lone surrogate": ("a\ud800b", "lone surrogate"),
}
BAD_TEXT = {"NUL": ("a\x00b", "NUL"), "lone surrogate": ("a\ud800b", "lone surrogate")}


@pytest.mark.parametrize("session_id, problem", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_a_bad_session_id_is_refused_and_creates_nothing(store: SessionStore, session_id: str, problem: str) -> None:
    for create in (
        lambda: store.create_session(session_id, "ada", "travel"),
        lambda: store.get_or_create_session(session_id, "ada", "travel"),
    ):
        with pytest.raises(InvalidIdError, match=problem) as caught:
            create()
        assert "use 1 to 128 printable characters" in str(caught.value)
    assert store.count_sessions() == 0


@pytest.mark.parametrize("session_id, problem", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_every_method_taking_a_session_id_applies_the_same_rule(
    store: SessionStore, session_id: str, problem: str
) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: store.get_session(session_id),
        lambda: store.messages(session_id),
        lambda: store.facts(session_id),
        lambda: store.append_message(session_id, "user", "hi", 1),
        lambda: store.upsert_fact(session_id, "slot", "city", "Lyon", 0.9, 1),
        lambda: store.update_state(session_id, {"a": 1}, 1),
        lambda: store.rename_session(session_id, "t"),
        lambda: store.end_session(session_id),
        lambda: store.delete_session(session_id),
    ]
    for call in calls:
        with pytest.raises(InvalidIdError, match=problem):
            call()


@pytest.mark.parametrize("field", ["user id", "bot"])
def test_user_and_bot_ids_follow_the_same_rule(store: SessionStore, field: str) -> None:
    user, bot = ("a\x00b", "travel") if field == "user id" else ("ada", "x" * 129)
    with pytest.raises(InvalidIdError, match=field):
        store.create_session("s1", user, bot)
    with pytest.raises(InvalidIdError, match="user id"):
        store.list_sessions(user_id="a\x00b")
    assert store.count_sessions() == 0


def test_the_longest_and_non_ascii_ids_are_accepted(store: SessionStore) -> None:
    longest, accented = "x" * 128, "séance-日本-🙂"
    for session_id in (longest, accented):
        store.create_session(session_id, "ada", "travel")
        assert store.get_session(session_id).id == session_id


@pytest.mark.parametrize("text, problem", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_a_message_no_backend_can_store_is_refused_and_nothing_is_written(
    store: SessionStore, text: str, problem: str
) -> None:
    before = store.create_session("s1", "ada", "travel")
    with pytest.raises(InvalidTextError, match=problem) as caught:
        store.append_message("s1", "user", text, 1)
    assert "nothing was written" in str(caught.value)
    assert store.messages("s1") == []
    assert store.get_session("s1") == before  # not even touched: expiry unchanged


@pytest.mark.parametrize("text, problem", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_facts_and_titles_follow_the_same_text_rule(store: SessionStore, text: str, problem: str) -> None:
    with pytest.raises(InvalidTextError, match=f"session title contains a {problem}"):
        store.create_session("s0", "ada", "travel", title=text)
    before = store.create_session("s1", "ada", "travel", title="Lyon")
    with pytest.raises(InvalidTextError, match=f"fact value contains a {problem}"):
        store.upsert_fact("s1", "slot", "city", text, 0.9, 1)
    with pytest.raises(InvalidTextError, match=f"fact name contains a {problem}"):
        store.upsert_fact("s1", "slot", text, "Lyon", 0.9, 1)
    with pytest.raises(InvalidTextError, match=f"session title contains a {problem}"):
        store.rename_session("s1", text)
    assert store.facts("s1") == []
    assert store.get_session("s1") == before
    assert [s.id for s in store.list_sessions()] == ["s1"]


def test_a_title_over_its_column_is_refused_on_every_backend(store: SessionStore) -> None:
    store.create_session("s1", "ada", "travel")
    with pytest.raises(InvalidTextError, match="201 characters long, over the limit of 200"):
        store.rename_session("s1", "t" * 201)
    assert store.rename_session("s1", "t" * 200).title == "t" * 200

"""A session nobody named is titled by its first message, as every hosted chat lists them."""

from __future__ import annotations

from chatcache.storage import SessionStore
from chatcache.storage.store import title_of


def test_the_first_user_message_titles_an_untitled_session(store: SessionStore) -> None:
    store.create_session("s1", "ada", "bank")
    store.append_message("s1", "system", "You are a bank.", 4)
    store.append_message("s1", "user", "  I want to\nsend 200 euros  ", 6)
    store.append_message("s1", "assistant", "To which account?", 4)
    store.append_message("s1", "user", "to account 12345674", 4)
    assert store.get_session("s1").title == "I want to send 200 euros"


def test_a_given_title_or_a_rename_stays(store: SessionStore) -> None:
    store.create_session("named", "ada", "bank", title="Rent")
    store.append_message("named", "user", "How much can I send?", 5)
    assert store.get_session("named").title == "Rent"
    store.create_session("s2", "ada", "bank")
    store.append_message("s2", "user", "Block my card", 3)
    store.rename_session("s2", "Stolen card")
    store.append_message("s2", "user", "It was stolen yesterday", 5)
    assert store.get_session("s2").title == "Stolen card"
    store.rename_session("s2", None)  # cleared on purpose: later messages do not name it again
    store.append_message("s2", "user", "Thanks", 2)
    assert store.get_session("s2").title is None


def test_a_long_first_message_is_cut_at_a_word_with_an_ellipsis() -> None:
    long = "Hello, I would like to know why my transfer to my landlord did not arrive yet"
    title = title_of(long)
    assert title == "Hello, I would like to know why my transfer to…" and len(title) <= 49
    assert title_of("x" * 100) == "x" * 48 + "…"  # no space to cut at: cut at the limit
    assert title_of("line one\n\tline two") == "line one line two"

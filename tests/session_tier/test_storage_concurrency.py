"""One store shared by threads: concurrent appends neither fail nor lose messages."""

from __future__ import annotations

import threading

from chatcache.storage import SessionStore

TURNS = 40


def append_concurrently(store: SessionStore, session_ids: list[str]) -> list[BaseException]:
    """Append TURNS messages from one thread per entry of `session_ids`, all at once."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(session_ids))

    def worker(session_id: str, name: str) -> None:
        try:
            start.wait()
            for turn in range(TURNS):
                store.append_message(session_id, "user", f"{name} {turn}", 1)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(session_id, f"t{i}"))
        for i, session_id in enumerate(session_ids)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_two_threads_append_to_their_own_sessions(store: SessionStore) -> None:
    store.create_session("a", "ada", "travel")
    store.create_session("b", "bob", "travel")

    assert append_concurrently(store, ["a", "b"]) == []

    for session_id, name in (("a", "t0"), ("b", "t1")):
        messages = store.messages(session_id)
        assert [m.seq for m in messages] == list(range(1, TURNS + 1))
        assert [m.content for m in messages] == [f"{name} {turn}" for turn in range(TURNS)]


def test_two_threads_appending_to_one_session_get_distinct_numbers(store: SessionStore) -> None:
    store.create_session("shared", "ada", "travel")

    assert append_concurrently(store, ["shared", "shared"]) == []

    messages = store.messages("shared")
    assert [m.seq for m in messages] == list(range(1, 2 * TURNS + 1))
    for name in ("t0", "t1"):  # each thread's own messages stay in its order
        mine = [m.content for m in messages if m.content.startswith(f"{name} ")]
        assert mine == [f"{name} {turn}" for turn in range(TURNS)]

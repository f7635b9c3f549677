"""A database locked by another writer fails fast and clearly, writing nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from chatcache.storage import ChatSession, SessionStore, StorageBusyError
from chatcache.storage.engine import DB_FILENAME

Write = Callable[[SessionStore, ChatSession], object]

WRITES: dict[str, Write] = {
    "create_session": lambda store, _: store.create_session("s2", "bob", "travel"),
    "append_message": lambda store, s: store.append_message(s.id, "user", "hi", 1),
    "upsert_fact": lambda store, s: store.upsert_fact(s.id, "slot", "city", "Lyon", 0.9, 1),
    "update_state": lambda store, s: store.update_state(s.id, {"step": 2}, s.version),
    "rename_session": lambda store, s: store.rename_session(s.id, "renamed"),
    "end_session": lambda store, s: store.end_session(s.id),
    "delete_session": lambda store, s: store.delete_session(s.id),
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    with SessionStore.open(tmp_path, busy_timeout=0.1) as opened:
        yield opened


def snapshot(data_dir: Path) -> list[list[tuple[object, ...]]]:
    """Every row a write could change, read around the store."""
    with closing(sqlite3.connect(data_dir / DB_FILENAME)) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("sessions", "messages", "session_facts")
        ]


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_write_while_another_connection_holds_the_lock_raises_busy(
    store: SessionStore, tmp_path: Path, write: Write
) -> None:
    session = store.create_session("s1", "ada", "travel")
    store.append_message("s1", "user", "first", 1)
    before = snapshot(tmp_path)

    locker = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StorageBusyError, match="locked") as caught:
            write(store, session)
    finally:
        locker.execute("ROLLBACK")
        locker.close()

    assert str(tmp_path / DB_FILENAME) in str(caught.value)
    assert snapshot(tmp_path) == before
    write(store, session)  # once the lock is gone the same write goes through
    assert snapshot(tmp_path) != before


def test_migrating_while_another_writer_holds_the_lock_raises_busy(tmp_path: Path) -> None:
    locker = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None)  # a new, empty file
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StorageBusyError, match="locked"):
            SessionStore.open(tmp_path, busy_timeout=0.1)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    with SessionStore.open(tmp_path, busy_timeout=0.1) as store:  # once the lock is gone it migrates
        assert store.create_session("s1", "ada", "travel").id == "s1"

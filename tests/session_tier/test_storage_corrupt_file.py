"""A damaged or foreign SQLite file is a clear error naming it, and is left exactly as it was.

SQLite only: PostgreSQL has no database file a user could damage or mix up.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from chatcache.storage import CorruptDatabaseError, SessionStore
from chatcache.storage.engine import DB_FILENAME

PAGE = 4096  # SQLite's default page size, which a fresh chatcache database uses


def filled_database(path: Path) -> bytes:
    """A real chatcache database with enough messages to span many pages; returns its bytes."""
    with SessionStore(f"sqlite:///{path}") as store:
        store.create_session("s1", "ada", "travel")
        for turn in range(100):
            store.append_message("s1", "user", f"message {turn} " + "x" * 400, 1)
    with sqlite3.connect(path) as conn:  # fold the WAL back into the file, so its bytes are the database
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.read_bytes()


def assert_clear(error: CorruptDatabaseError, path: Path) -> None:
    message = str(error)
    assert str(path) in message
    assert "move the file away" in message and "restore it from a backup" in message


def test_a_file_of_random_bytes_in_the_data_dir_is_refused_untouched(tmp_path: Path) -> None:
    garbage = os.urandom(3 * PAGE)
    (tmp_path / DB_FILENAME).write_bytes(garbage)
    with pytest.raises(CorruptDatabaseError) as caught:
        SessionStore.open(tmp_path)
    assert_clear(caught.value, tmp_path / DB_FILENAME)
    assert (tmp_path / DB_FILENAME).read_bytes() == garbage


def test_a_file_that_is_not_a_database_given_as_the_url_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("system_prompt: this is a bot file, not a database\n" * 200)
    with pytest.raises(CorruptDatabaseError, match="not a database") as caught:
        SessionStore(f"sqlite:///{notes}")
    assert_clear(caught.value, notes)


@pytest.mark.parametrize("kept", [0.25, 0.5, 0.9])
def test_a_truncated_database_is_refused_on_opening(tmp_path: Path, kept: float) -> None:
    path = tmp_path / "sessions.db"
    data = filled_database(path)
    truncated = data[: int(len(data) * kept) // PAGE * PAGE]
    path.write_bytes(truncated)
    with pytest.raises(CorruptDatabaseError, match="malformed") as caught:
        SessionStore(f"sqlite:///{path}")
    assert_clear(caught.value, path)
    assert path.read_bytes() == truncated


def test_damage_found_after_opening_is_the_same_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    data = bytearray(filled_database(path))
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()
    start = (root - 1) * PAGE
    data[start : start + 100] = b"\xff" * 100  # the messages table's root page: sessions still read
    path.write_bytes(bytes(data))
    with SessionStore(f"sqlite:///{path}") as store:
        assert store.get_session("s1").id == "s1"
        with pytest.raises(CorruptDatabaseError) as caught:
            store.messages("s1")
        assert_clear(caught.value, path)
        with pytest.raises(CorruptDatabaseError):
            store.append_message("s1", "user", "hello", 1)

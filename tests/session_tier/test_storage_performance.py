"""A turn's reads and writes stay fast with many sessions, because they use indexes."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from chatcache.storage import SessionStore
from chatcache.storage.engine import DB_FILENAME

SESSIONS = 10_000
MESSAGES_EACH = 20


def fill(data_dir: Path) -> None:
    """Insert SESSIONS sessions with MESSAGES_EACH messages each, bypassing the store."""
    now = datetime(2025, 1, 1)
    later = now + timedelta(days=1)
    with closing(sqlite3.connect(data_dir / DB_FILENAME)) as conn:
        conn.executemany(
            "INSERT INTO sessions (id, user_id, bot, title, status, version, state, created_at, updated_at, expires_at)"
            " VALUES (?, ?, 'travel', NULL, 'active', 1, '{}', ?, ?, ?)",
            (
                (f"s{i}", f"u{i % 100}", now, now + timedelta(seconds=i), later)
                for i in range(SESSIONS)
            ),
        )
        conn.executemany(
            "INSERT INTO messages (session_id, seq, role, content, token_count, created_at)"
            " VALUES (?, ?, 'user', 'some words of a turn', 5, ?)",
            ((f"s{i}", seq, now) for i in range(SESSIONS) for seq in range(1, MESSAGES_EACH + 1)),
        )
        conn.commit()


@pytest.fixture
def big_store(tmp_path: Path) -> SessionStore:
    SessionStore.open(tmp_path).close()
    fill(tmp_path)
    return SessionStore.open(tmp_path)


@pytest.mark.parametrize(
    ("query", "index"),
    [
        (
            "SELECT * FROM messages WHERE session_id = 's5' ORDER BY seq DESC LIMIT 20",
            "ix_messages_session_seq",
        ),
        ("SELECT max(seq) FROM messages WHERE session_id = 's5'", "ix_messages_session_seq"),
        ("SELECT * FROM sessions ORDER BY updated_at DESC LIMIT 20", "ix_sessions_updated_at"),
        (
            "SELECT id FROM sessions WHERE status = 'active' AND expires_at <= '2025-01-02'",
            "ix_sessions_status_expires",
        ),
    ],
)
def test_hot_queries_use_an_index(tmp_path: Path, query: str, index: str) -> None:
    SessionStore.open(tmp_path).close()
    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        plan = " ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}"))

    assert index in plan


def test_a_turns_reads_and_writes_find_their_session_among_ten_thousand(
    big_store: SessionStore,
) -> None:
    """What a turn reads and writes with many sessions stored; how fast is `bench.session_tiers`'
    business (a timed assertion here would only measure how busy the machine is)."""
    for turn in range(30):
        session = big_store.get_session("s5000")
        big_store.append_message(session.id, "user", f"turn {turn}", 3)
        history = big_store.messages(session.id, limit=20)
    big_store.close()

    assert [m.content for m in history[-2:]] == ["turn 28", "turn 29"]
    assert len(history) == 20 and history[-1].seq == MESSAGES_EACH + 30

"""Schema migrations: fresh databases reach the newest version, reruns do nothing."""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.engine import URL, Connection

from chatcache.storage import SchemaVersionError, SessionStore, migrations
from chatcache.storage.engine import DB_FILENAME, create_storage_engine, sqlite_url
from chatcache.storage.migrations import MIGRATIONS, Migration
from chatcache.storage.models import Base

LATEST = MIGRATIONS[-1].version


def recorded_versions(data_dir: Path) -> list[int]:
    with closing(sqlite3.connect(data_dir / DB_FILENAME)) as conn:
        return [
            row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY version")
        ]


def table_names(data_dir: Path) -> set[str]:
    with closing(sqlite3.connect(data_dir / DB_FILENAME)) as conn:
        return {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }


def insert_old_session(data_dir: Path, session_id: str, state: dict[str, object]) -> None:
    """A session row as schemas 3 and 4 laid it out (the current models would write columns they lack)."""
    now = datetime.now()
    with closing(sqlite3.connect(data_dir / DB_FILENAME)) as conn:
        conn.execute(
            "INSERT INTO sessions (id, user_id, bot, title, status, version, state, created_at, updated_at, expires_at)"
            " VALUES (?, 'ada', 'travel', NULL, 'active', 1, ?, ?, ?, ?)",
            (session_id, json.dumps(state), now.isoformat(" "), now.isoformat(" "), (now + timedelta(hours=1)).isoformat(" ")),
        )
        conn.commit()


def test_migrations_are_numbered_one_up_without_gaps() -> None:
    assert [step.version for step in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


def test_a_fresh_database_gets_every_migration(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path) as store:
        assert store.schema_version == LATEST

    assert recorded_versions(tmp_path) == list(range(1, LATEST + 1))
    assert {"sessions", "messages", "session_facts", "schema_version"} <= table_names(tmp_path)


def test_reopening_changes_nothing_and_keeps_data(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path) as store:
        store.create_session("s1", "ada", "travel")
    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        applied_before = conn.execute("SELECT * FROM schema_version").fetchall()

    with SessionStore.open(tmp_path) as store:
        assert store.schema_version == LATEST
        assert store.get_session("s1").user_id == "ada"

    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        assert conn.execute("SELECT * FROM schema_version").fetchall() == applied_before


def test_a_database_from_a_newer_chatcache_is_refused_clearly(tmp_path: Path) -> None:
    SessionStore.open(tmp_path).close()
    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        conn.execute(
            "INSERT INTO schema_version VALUES (?, 'from the future', ?)",
            (LATEST + 1, datetime(2030, 1, 1).isoformat(" ")),
        )
        conn.commit()

    with pytest.raises(SchemaVersionError, match=f"schema version {LATEST + 1}") as caught:
        SessionStore.open(tmp_path)

    assert str(tmp_path / DB_FILENAME) in str(caught.value)
    assert (caught.value.found, caught.value.supported) == (LATEST + 1, LATEST)


def test_a_failing_migration_rolls_back_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_done(conn: Connection) -> None:
        conn.exec_driver_sql("CREATE TABLE half_done (id INTEGER)")
        raise RuntimeError("step failed")

    broken = (*MIGRATIONS, Migration(LATEST + 1, "fails halfway", half_done))
    monkeypatch.setattr(migrations, "MIGRATIONS", broken)

    with pytest.raises(RuntimeError, match="step failed"):
        SessionStore.open(tmp_path)

    assert table_names(tmp_path) == set()


def test_the_models_match_the_migrated_schema(tmp_path: Path) -> None:
    SessionStore.open(tmp_path).close()
    engine = create_storage_engine(sqlite_url(tmp_path), busy_timeout=1)
    try:
        db = inspect(engine)
        for table in Base.metadata.sorted_tables:
            assert [c["name"] for c in db.get_columns(table.name)] == list(table.columns.keys())
            assert [c["nullable"] for c in db.get_columns(table.name)] == [
                c.nullable for c in table.columns
            ]
            indexes = {i["name"] for i in db.get_indexes(table.name)}
            indexes |= {u["name"] for u in db.get_unique_constraints(table.name)}
            assert {i.name for i in table.indexes} <= indexes
            assert {c.name for c in table.constraints if c.name} <= indexes
            assert [fk["options"] for fk in db.get_foreign_keys(table.name)] == [
                {"ondelete": fk.ondelete} for fk in table.foreign_keys
            ]
    finally:
        engine.dispose()


def test_stores_opening_a_fresh_database_at_once_migrate_it_once(store_url: str | URL) -> None:
    """Replicas that start together: every one opens the database, and each migration is applied once."""
    barrier = threading.Barrier(6)
    outcomes: list[BaseException | int] = []

    def open_store() -> None:
        barrier.wait()
        try:
            with SessionStore(store_url) as store:
                outcomes.append(store.schema_version)
        except BaseException as error:  # noqa: BLE001 - the test reads every outcome
            outcomes.append(error)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert outcomes == [MIGRATIONS[-1].version] * 6
    engine = create_storage_engine(store_url, busy_timeout=30)
    try:
        with engine.connect() as connection:
            applied = connection.execute(select(migrations.schema_version_table.c.version)).scalars().all()
    finally:
        engine.dispose()
    assert sorted(applied) == [step.version for step in MIGRATIONS]


def test_a_version_3_database_gains_the_answer_audits_table_and_keeps_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database written before audits were persisted (schema 3) is upgraded in place: its
    sessions stay, `answer_audits` appears, and an audit can be stored and read back."""
    from datetime import timezone

    from chatcache.storage import AuditRecord

    with monkeypatch.context() as older:
        older.setattr(migrations, "MIGRATIONS", MIGRATIONS[:3])
        with SessionStore.open(tmp_path) as store:
            assert store.schema_version == 3
    insert_old_session(tmp_path, "s1", {})
    assert "answer_audits" not in table_names(tmp_path)

    with SessionStore.open(tmp_path) as store:
        assert store.schema_version == LATEST >= 4
        assert store.get_session("s1").user_id == "ada"
        audit = AuditRecord(0, "scope-a", 7, False, 0.83, False, datetime(2026, 1, 1, tzinfo=timezone.utc))
        stored = store.answer_audits.add(audit)
        assert stored.id > 0 and store.answer_audits.added_after(0) == [stored]
        assert stored == AuditRecord(stored.id, "scope-a", 7, False, 0.83, False, audit.audited_at)
    assert "answer_audits" in table_names(tmp_path)
    assert recorded_versions(tmp_path) == list(range(1, LATEST + 1))


def test_a_version_4_database_moves_flow_active_out_of_the_state_into_pinned(
    store_url: str | URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before schema 5 the store read a top-level `"flow_active": true` in the state to keep a
    session mid-flow from expiring. Upgraded, such a session is pinned instead, the key is gone
    from its state and the rest of the state is as it was; the others expire as before. On
    SQLite and PostgreSQL (whose JSON and BOOLEAN columns the migration writes otherwise)."""
    from datetime import timezone

    from sqlalchemy import JSON, Column, DateTime, Integer, MetaData, String, Table, insert

    from chatcache.storage import SessionStatus

    states = {
        "mid-flow": {"dialogue": {"state": "CONFIRMING", "flow_active": True}, "flow_active": True, "context_start": 2},
        "flow-done": {"dialogue": {"state": "DONE", "flow_active": False}, "flow_active": False},
        "no-flow": {"step": 1},
        "untouched": {},
    }
    with monkeypatch.context() as older:
        older.setattr(migrations, "MIGRATIONS", MIGRATIONS[:4])
        with SessionStore(store_url) as store:
            assert store.schema_version == 4
    # Session rows as schema 4 laid them out (the current models would write a column it lacks).
    v4 = Table(
        "sessions", MetaData(), Column("id", String(128)), Column("user_id", String(128)), Column("bot", String(128)),
        Column("status", String(16)), Column("version", Integer), Column("state", JSON),
        Column("created_at", DateTime), Column("updated_at", DateTime), Column("expires_at", DateTime),
    )  # fmt: skip
    now = datetime.now()
    engine = create_storage_engine(store_url, busy_timeout=30)
    try:
        with engine.begin() as connection:
            for session_id, state in states.items():
                connection.execute(insert(v4).values(
                    id=session_id, user_id="ada", bot="travel", status="active", version=1, state=state,
                    created_at=now, updated_at=now, expires_at=now + timedelta(hours=1),
                ))  # fmt: skip
        assert "pinned" not in {column["name"] for column in inspect(engine).get_columns("sessions")}
    finally:
        engine.dispose()

    with SessionStore(store_url) as store:
        assert store.schema_version == LATEST >= 5
        upgraded = {s.id: s for s in store.list_sessions()}
        assert {i: s.pinned for i, s in upgraded.items()} == {"mid-flow": True, "flow-done": False, "no-flow": False, "untouched": False}
        assert upgraded["mid-flow"].state == {"dialogue": {"state": "CONFIRMING", "flow_active": True}, "context_start": 2}
        assert upgraded["flow-done"].state == {"dialogue": {"state": "DONE", "flow_active": False}}
        assert upgraded["no-flow"].state == {"step": 1} and upgraded["untouched"].state == {}
        later = datetime.now(timezone.utc) + timedelta(days=30)
        assert sorted(store.expire_sessions(later)) == ["flow-done", "no-flow", "untouched"]
        assert store.get_session("mid-flow").status is SessionStatus.ACTIVE

"""Versioned schema migrations, applied in order when a store opens.

Each step is a function of a connection; the steps that a database lacks run in one
transaction and are recorded in `schema_version`, so a crash mid-upgrade leaves the
previous schema intact. Steps are frozen once released: a step describes the schema as it
was then, never by importing `storage.models`, so replaying history on a fresh database
always ends at the same tables an old database is upgraded to. To change the schema, add a
step and update the models to match.

Deliberately not Alembic: a handful of forward-only steps needs no autogeneration,
branching or downgrades.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    LargeBinary,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection

from chatcache.storage.errors import SchemaVersionError

MIGRATION_LOCK = 0x63686174_6D696772  # "chatmigr": the PostgreSQL advisory lock key `migrate` holds

@dataclass(frozen=True)
class Migration:
    """One schema step: `apply` takes the database from `version - 1` to `version`."""

    version: int
    description: str
    apply: Callable[[Connection], None]


_bookkeeping = MetaData()
schema_version_table = Table(
    "schema_version",
    _bookkeeping,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", String(200), nullable=False),
    Column("applied_at", DateTime, nullable=False),
)


def _create_tables(conn: Connection) -> None:
    """Version 1: sessions, messages and session facts."""
    v1 = MetaData()
    Table(
        "sessions",
        v1,
        Column("id", String(128), primary_key=True),
        Column("user_id", String(128), nullable=False),
        Column("bot", String(128), nullable=False),
        Column("title", String(200), nullable=True),
        Column("status", String(16), nullable=False),
        Column("version", Integer, nullable=False),
        Column("state", JSON, nullable=False),
        Column("created_at", DateTime, nullable=False),
        Column("updated_at", DateTime, nullable=False),
        Column("expires_at", DateTime, nullable=False),
        Index("ix_sessions_updated_at", "updated_at"),
        Index("ix_sessions_user_updated", "user_id", "updated_at"),
        Index("ix_sessions_status_expires", "status", "expires_at"),
    )
    Table(
        "messages",
        v1,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column(
            "session_id",
            String(128),
            ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("seq", Integer, nullable=False),
        Column("role", String(16), nullable=False),
        Column("content", Text, nullable=False),
        Column("token_count", Integer, nullable=False),
        Column("created_at", DateTime, nullable=False),
        Column("meta", JSON, nullable=True),
        Index("ix_messages_session_seq", "session_id", "seq", unique=True),
    )
    Table(
        "session_facts",
        v1,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column(
            "session_id",
            String(128),
            ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("kind", String(16), nullable=False),
        Column("name", String(128), nullable=False),
        Column("value", Text, nullable=False),
        Column("confidence", Float, nullable=False),
        Column("source_turn", Integer, nullable=False),
        Column("created_at", DateTime, nullable=False),
        UniqueConstraint("session_id", "kind", "name", name="uq_session_facts_key"),
    )
    v1.create_all(conn)


def _create_answer_entries(conn: Connection) -> None:
    """Version 2: the answer cache's entries, embeddings stored as float32 blobs."""
    v2 = MetaData()
    Table(
        "answer_entries",
        v2,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("scope", String(64), nullable=False),
        Column("intent", String(128), nullable=True),
        Column("question", Text, nullable=False),
        Column("normalized", Text, nullable=False),
        Column("answer", Text, nullable=False),
        Column("embedding", LargeBinary, nullable=False),
        Column("entropy_bits", Float, nullable=False),
        Column("latency_ms", Float, nullable=False),
        Column("prefetched", Boolean, nullable=False),
        Column("hits", Integer, nullable=False),
        Column("created_at", DateTime, nullable=False),
        Column("expires_at", DateTime, nullable=False),
        Column("last_hit_at", DateTime, nullable=True),
        Index("ix_answer_entries_scope_normalized", "scope", "normalized"),
        Index("ix_answer_entries_expires", "expires_at"),
    )
    v2.create_all(conn)


def _add_turn_leases_and_reply_to(conn: Connection) -> None:
    """Version 3: a session's turn lease (one process answers it at a time), and which question a reply answers."""
    columns = (
        ("sessions", "lease_holder", String(64)),
        ("sessions", "lease_expires_at", DateTime()),
        ("messages", "reply_to", Integer()),
    )
    for table, column, kind in columns:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {kind.compile(dialect=conn.dialect)}"))


def _create_answer_audits(conn: Connection) -> None:
    """Version 4: the answer cache's audits (a served answer checked against the model's own), shared by replicas."""
    v4 = MetaData()
    Table(
        "answer_audits",
        v4,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("scope", String(64), nullable=False),
        Column("entry_id", Integer, nullable=False),
        Column("exact", Boolean, nullable=False),
        Column("similarity", Float, nullable=False),
        Column("agreed", Boolean, nullable=False),
        Column("audited_at", DateTime, nullable=False),
    )
    v4.create_all(conn)


def _add_session_pins(conn: Connection) -> None:
    """Version 5: whether a session is kept from expiring, a column its owner sets with each state.

    Until now the store read the rule from the state itself (a top-level `"flow_active": true`
    kept a session mid-flow alive); that flag moves into the column and out of the state.
    """
    conn.execute(text("ALTER TABLE sessions ADD COLUMN pinned BOOLEAN DEFAULT FALSE NOT NULL"))
    v5 = MetaData()
    sessions = Table(
        "sessions",
        v5,
        Column("id", String(128), primary_key=True),
        Column("state", JSON, nullable=False),
        Column("pinned", Boolean, nullable=False),
    )
    for session_id, state in conn.execute(select(sessions.c.id, sessions.c.state)).all():
        if isinstance(state, dict) and "flow_active" in state:
            pinned = state.pop("flow_active") is True
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(state=state, pinned=pinned))


def _add_session_claims(conn: Connection) -> None:
    """Version 6: which person has claimed a handed-off session (None: nobody yet).

    A column rather than a key of the state: the state is the dialogue's, written by whoever
    runs a turn, while a claim is taken by one compare-and-set UPDATE that replicas share.
    """
    conn.execute(text("ALTER TABLE sessions ADD COLUMN claimed_by VARCHAR(64)"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create sessions, messages and session facts", _create_tables),
    Migration(2, "create answer cache entries", _create_answer_entries),
    Migration(3, "add turn leases to sessions and reply_to to messages", _add_turn_leases_and_reply_to),
    Migration(4, "create answer cache audits", _create_answer_audits),
    Migration(5, "add pinned to sessions, from the state's flow_active", _add_session_pins),
    Migration(6, "add claimed_by to sessions", _add_session_claims),
)


def migrate(conn: Connection, location: str) -> int:
    """Bring the database up to the newest schema this code knows.

    Args:
        conn: A connection in the transaction the upgrade runs in (all of it or nothing).
        location: How to name the database in errors (a file path or a URL).

    Returns:
        The schema version the database is at afterwards.

    Raises:
        SchemaVersionError: The database was written by a newer schema than `MIGRATIONS`.
    """
    latest = MIGRATIONS[-1].version
    if conn.dialect.name == "postgresql":
        # Replicas that start together would all create the tables at once and all but one
        # fail; this lock, held to the end of the transaction, has them migrate one by one
        # (the later ones find the schema current). SQLite serialises writers by itself.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    _bookkeeping.create_all(conn)
    current: int = conn.scalar(select(func.max(schema_version_table.c.version))) or 0
    if current > latest:
        raise SchemaVersionError(location, found=current, supported=latest)
    for step in MIGRATIONS:
        if step.version > current:
            step.apply(conn)
            conn.execute(
                insert(schema_version_table).values(
                    version=step.version,
                    description=step.description,
                    applied_at=datetime.now(timezone.utc).replace(tzinfo=None),
                )
            )
    return latest

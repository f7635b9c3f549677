"""Where the database lives and how to connect to it.

This is the only module that knows SQLite is special: the connect hook below turns on WAL
(readers never wait for the writer), foreign keys (so deleting a session cascades), a busy
timeout and synchronous=NORMAL, and hands transaction control to SQLAlchemy so that DDL
and reads are transactional too. Every other module works on any SQLAlchemy URL, e.g. PostgreSQL.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry

from chatcache.storage.errors import StorageConfigError

DATA_DIR_ENV = "CHATCACHE_DATA_DIR"
ACTIONS_DIR_ENV = "CHATCACHE_ACTIONS_DIR"
DB_FILENAME = "chatcache.db"


def default_data_dir() -> Path:
    """Where chatcache keeps its database, converted models and spilled KV.

    `$CHATCACHE_DATA_DIR` wins; otherwise `chatcache` under the XDG data home
    (`~/.local/share` unless `$XDG_DATA_HOME` says otherwise).
    """
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "chatcache"


def actions_data_dir() -> Path:
    """Where a bot's actions keep what they own (the demo bank's database): `$CHATCACHE_ACTIONS_DIR`,
    else the data directory. `chatcache test-bot` points it at a directory of its own, so that
    a bot's stories start from a new world and leave the one its users chat in as it was."""
    configured = os.environ.get(ACTIONS_DIR_ENV)
    return Path(configured).expanduser() if configured else default_data_dir()


def sqlite_url(data_dir: Path) -> URL:
    """Create `data_dir` if needed and return the URL of the database file inside it.

    Args:
        data_dir: Directory that holds `chatcache.db`.

    Returns:
        A `sqlite:///` URL for `data_dir / chatcache.db`.

    Raises:
        StorageConfigError: The directory cannot be created.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageConfigError(f"cannot create data directory {data_dir}: {exc}") from exc
    return URL.create("sqlite", database=str(data_dir / DB_FILENAME))


def describe(url: URL) -> str:
    """Name a database for error messages: its file for SQLite, else the password-free URL."""
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return url.render_as_string(hide_password=True)


IMMEDIATE = "chatcache_begin_immediate"  # the execution option that asks SQLite for BEGIN IMMEDIATE


def create_storage_engine(url: str | URL, busy_timeout: float) -> Engine:
    """Build the engine for `url`, with SQLite tuned for concurrent use.

    Args:
        url: Any SQLAlchemy database URL.
        busy_timeout: Seconds a SQLite write waits for another writer before failing.

    Returns:
        An engine; nothing has connected yet.

    Raises:
        StorageConfigError: The URL is malformed or its driver is not installed.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageConfigError(f"malformed database URL: {exc}") from exc
    try:
        engine = create_engine(parsed)
    except (ArgumentError, ImportError) as exc:
        raise StorageConfigError(f"unusable database URL {describe(parsed)}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        _tune_sqlite(engine, busy_timeout)
    return engine


def _tune_sqlite(engine: Engine, busy_timeout: float) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # The sqlite3 driver would BEGIN only before INSERT/UPDATE/DELETE, leaving DDL
        # (migrations) and reads outside the transaction; we emit BEGIN ourselves below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        _switch_to_wal(cursor, busy_timeout)
        # With WAL, NORMAL cannot corrupt the file; a power cut may drop the last commits,
        # a fair price for appends about five times cheaper than with FULL's fsync.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        # IMMEDIATE (`Database.transaction(immediate=True)`) takes the write lock at BEGIN.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(IMMEDIATE) else "BEGIN")


def _switch_to_wal(cursor: Any, busy_timeout: float) -> None:
    """Put the database in WAL mode, waiting up to `busy_timeout` for the lock that takes.

    A new database switches from its rollback journal under an exclusive lock, and SQLite answers
    "database is locked" at once there, without its busy handler: six stores opening one new file
    together (replicas starting at once) failed about one time in sixteen while another one's
    connection migrated it. A database already in WAL mode answers at once and never waits.
    """
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def is_busy(exc: DBAPIError) -> bool:
    """Tell whether `exc` means another writer held the lock past the busy timeout."""
    return "database is locked" in str(exc.orig)


def is_corrupt(exc: DBAPIError) -> bool:
    """Tell whether `exc` means the SQLite file is damaged or is not a database at all."""
    # SQLITE_NOTADB: not a database (random bytes, another format); SQLITE_CORRUPT and its
    # extended codes: a damaged or truncated file.
    name = getattr(exc.orig, "sqlite_errorname", "")
    return isinstance(name, str) and name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))

"""Where the demo bank's database lives and how to connect to it.

`$CHATCACHE_BANK_DB` names it (any SQLAlchemy URL); by default it is `bank_demo.sqlite` in the
directory where bots' actions keep their data (chatcache's data directory, beside the session
tier's database but apart from it, so a demo's money can be reset by deleting one file; a
directory of its own while `chatcache test-bot` runs the stories). SQLite is tuned for threads that write at once: WAL,
a busy timeout, and write transactions that take the lock when they begin (see below).
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.pool import ConnectionPoolEntry

from chatcache.config import actions_data_dir

DB_ENV = "CHATCACHE_BANK_DB"
DB_FILENAME = "bank_demo.sqlite"
BUSY_TIMEOUT_MS = 30_000


def database_url() -> str:
    """`$CHATCACHE_BANK_DB`, else the demo file where bots' actions keep their data (created for it)."""
    configured = os.environ.get(DB_ENV)
    if configured:
        return configured
    directory = actions_data_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / DB_FILENAME}"


def connect(url: str) -> Engine:
    """The engine for `url`, with SQLite tuned for concurrent writers; nothing has connected yet."""
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _tune_sqlite)
        event.listen(engine, "begin", _begin_immediate)
    return engine


def _tune_sqlite(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # WAL: readers never wait for the writer. The busy timeout: a writer queues for the lock
    # instead of failing with "database is locked".
    dbapi_connection.isolation_level = None  # the driver would BEGIN lazily; _begin_immediate does
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.close()


def _begin_immediate(connection: Connection) -> None:
    # A deferred BEGIN reads first and asks for the write lock later; in WAL mode, if another
    # writer committed in between, SQLite refuses the upgrade at once (SQLITE_BUSY, which the
    # busy timeout does not cover). Taking the lock at BEGIN makes writers queue instead.
    connection.exec_driver_sql("BEGIN IMMEDIATE")

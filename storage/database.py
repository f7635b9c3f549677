"""A migrated database handing out short transactions with storage errors.

`SessionStore` holds one `Database` and never sees an engine, a pool or a driver error:
opening migrates the schema, and every transaction turns "database is locked" into a
`StorageBusyError` after rolling back, so a failed write leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import URL, Delete, Update
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from chatcache.storage.engine import IMMEDIATE, create_storage_engine, describe, is_busy, is_corrupt
from chatcache.storage.errors import CorruptDatabaseError, StorageBusyError, StorageConfigError
from chatcache.storage.migrations import migrate

# A reader following a table by id (`added_after`) re-reads this many ids below the highest it
# has seen: another process may commit a lower id after a higher one (ids are handed out
# before commit).
SYNC_OVERLAP = 16


def rows_changed(db: Session, statement: Update | Delete) -> int:
    """Run an UPDATE or DELETE in `db`'s transaction; return how many rows it matched."""
    # Core execution: ORM execution is typed as a plain Result, which hides rowcount.
    return db.connection().execute(statement).rowcount


class Database:
    """Connection pool and transactions for one database URL.

    Args:
        url: Any SQLAlchemy URL.
        busy_timeout: Seconds a SQLite write waits for another writer.

    Raises:
        StorageConfigError: The URL is unusable or the database cannot be opened.
        StorageBusyError: Another writer held the database during migration.
        SchemaVersionError: The database was written by a newer schema.
        CorruptDatabaseError: The database file is damaged or not a database.
    """

    def __init__(self, url: str | URL, busy_timeout: float) -> None:
        self._engine = create_storage_engine(url, busy_timeout)
        self.location = describe(self._engine.url)
        # expire_on_commit=False: rows stay readable after commit, while records are built.
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            # Processes opening a new database at once (replicas) migrate it one at a time.
            with self.transaction(immediate=True) as db:  # a busy database is a StorageBusyError from here
                self.schema_version = migrate(db.connection(), self.location)
        except OperationalError as exc:
            self.close()
            raise StorageConfigError(f"cannot open database {self.location}: {exc.orig}") from exc
        except BaseException:
            self.close()
            raise

    @contextmanager
    def transaction(self, immediate: bool = False) -> Iterator[Session]:
        """Yield a session in a transaction: committed on success, rolled back on error.

        `immediate`: on SQLite, take the write lock when the transaction begins. One that reads
        before it writes (a migration) otherwise fails at once, whatever the busy timeout, when
        another connection wrote in between: SQLite refuses to upgrade its read to a write.

        Raises:
            StorageBusyError: Another writer held the lock past the busy timeout.
            CorruptDatabaseError: The file turned out damaged, on opening or any later read.
        """
        try:
            with self._sessions.begin() as db:
                if immediate:
                    db.connection(execution_options={IMMEDIATE: True})
                yield db
        except DatabaseError as exc:  # OperationalError ("database is locked") is one too
            if is_busy(exc):
                raise StorageBusyError(self.location) from exc
            if is_corrupt(exc):
                raise CorruptDatabaseError(self.location, str(exc.orig)) from exc
            raise

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

"""The errors the session tier raises, each naming what went wrong and where.

Callers catch these instead of SQLAlchemy or driver exceptions, so the engine never has
to know which database sits underneath. Every error derives from `StorageError`.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class for every error raised by the session tier."""


class StorageConfigError(StorageError):
    """The database URL or data directory cannot be used."""


class StorageBusyError(StorageError):
    """Another writer held the database longer than the busy timeout.

    The failed operation's transaction was rolled back, so nothing was half-written
    and the caller may simply retry.
    """

    def __init__(self, location: str) -> None:
        super().__init__(
            f"database {location} is locked by another writer; nothing was written, retry later"
        )
        self.location = location


class SchemaVersionError(StorageError):
    """The database was written by a newer chatcache than this one."""

    def __init__(self, location: str, found: int, supported: int) -> None:
        super().__init__(
            f"database {location} has schema version {found}, but this chatcache only "
            f"understands up to version {supported}; upgrade chatcache or use another data dir"
        )
        self.location = location
        self.found = found
        self.supported = supported


class UnknownSessionError(StorageError, KeyError):
    """No session has the given id.

    It is also a `KeyError`, so code that treats the store like a mapping keeps working.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id

    def __str__(self) -> str:
        # KeyError.__str__ would print only the repr of the id, with no explanation.
        return f"unknown session {self.session_id!r}"


class SessionExistsError(StorageError):
    """A session id is already taken (by this user or another)."""

    def __init__(self, session_id: str, detail: str = "already exists") -> None:
        super().__init__(f"session {session_id!r} {detail}")
        self.session_id = session_id


class SessionClosedError(StorageError):
    """A write was attempted on a session that has ended or expired."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(f"session {session_id!r} is {status}; start a new session to continue")
        self.session_id = session_id
        self.status = status


class StaleVersionError(StorageError):
    """The session's state changed since the caller read it (optimistic locking).

    Re-read the session with `SessionStore.get_session` and apply the change again.
    """

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r} is at version {actual}, not {expected}; "
            "re-read it and retry the update"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class SessionBusyError(StorageError):
    """Another process is answering this session and kept it for longer than the caller waits.

    Nothing was written; send the message again when that turn has finished.
    """

    def __init__(self, session_id: str, waited_s: float) -> None:
        super().__init__(
            f"session {session_id!r} is answering another message in another process "
            f"(waited {waited_s:g} s); nothing was written, send it again in a moment"
        )
        self.session_id = session_id


class LeaseLostError(StorageError):
    """A turn's lease ran out (it stalled past the lease's ttl) and another process took the session.

    The write was refused so the two turns cannot interleave; the turn's reply is not recorded.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} was taken over by another process while this turn stalled; "
            "its reply was not recorded, ask again"
        )
        self.session_id = session_id


class SessionClaimedError(StorageError):
    """Another person has already claimed this session; `holder` names them."""

    def __init__(self, session_id: str, holder: str) -> None:
        super().__init__(f"{holder} has already taken over session {session_id!r}")
        self.session_id = session_id
        self.holder = holder


class CorruptDatabaseError(StorageError):
    """The database file is damaged, or is not a SQLite database at all.

    Nothing was written to it; chatcache never tries to repair or overwrite such a file.
    """

    def __init__(self, location: str, detail: str) -> None:
        super().__init__(
            f"database {location} is damaged or not a chatcache database ({detail}); "
            "move the file away to start with an empty one, or restore it from a backup"
        )
        self.location = location


class InvalidIdError(StorageError, ValueError):
    """A session, user or bot id that breaks the one rule every backend can keep alike.

    It is also a `ValueError`, as the empty session id always was.
    """

    def __init__(self, what: str, value: object, problem: str) -> None:
        shown = value[:40] + "..." if isinstance(value, str) and len(value) > 40 else value
        super().__init__(f"{what} {shown!r} {problem}; use 1 to 128 printable characters")
        self.what = what
        self.value = value


class InvalidTextError(StorageError, ValueError):
    """Text that some database cannot store (a NUL, a lone surrogate) or too long for its field."""

    def __init__(self, what: str, problem: str) -> None:
        super().__init__(f"{what} {problem}; nothing was written")
        self.what = what

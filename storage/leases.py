"""Turn leases: one process at a time answers a session, on SQLite and PostgreSQL alike.

A thread lock serialises one process's turns only; two `chatcache ask` on one session, two
app windows or two workers would interleave their messages (user, user, assistant,
assistant). A lease is two columns of the session row, taken by one compare-and-set UPDATE
(PostgreSQL's row lock and SQLite's write lock make it atomic), renewed by a background
thread while the turn runs and cleared at its end. A process that dies mid-turn stops
renewing, so its lease runs out after `ttl` and the session can be answered again. Writes
made during a turn name the lease (`SessionStore.append_message(lease=...)`), so a holder
that stalled past `ttl` and lost the session cannot append after another process's turn.

It does not queue waiters fairly: they poll, and whoever asks first after a release wins.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update

from chatcache.storage.database import Database, rows_changed
from chatcache.storage.errors import SessionBusyError, StorageBusyError, UnknownSessionError
from chatcache.storage.models import MessageRow, SessionRow

# A replica that dies holding a session keeps it from the others this long (renewed every third).
DEFAULT_LEASE_TTL = timedelta(seconds=10)
DEFAULT_LEASE_WAIT_S = 120.0
_POLL_S = (0.005, 0.2)  # first and longest pause between tries while another process holds it


@dataclass(frozen=True)
class SessionHead:
    """The session's record when the lease was taken: a copy in memory that differs is stale.

    Attributes:
        version: the state's version (every state write raises it).
        last_seq: the seq of the newest message, 0 when there is none.
    """

    version: int
    last_seq: int


@dataclass(frozen=True)
class Lease:
    """A held turn lease: pass `holder` to the writes made under it."""

    session_id: str
    holder: str
    head: SessionHead


class TurnLeases:
    """Takes, renews and releases sessions' turn leases in one database.

    Args:
        db: the session tier's database.
        clock: the store's clock (aware UTC).
        ttl: how long a lease lasts without renewal; a crashed holder blocks the session this long.
    """

    def __init__(self, db: Database, clock: Callable[[], datetime], ttl: timedelta = DEFAULT_LEASE_TTL) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"lease ttl must be positive, got {ttl}")
        self._db = db
        self._clock = clock
        self.ttl = ttl

    def try_acquire(self, session_id: str, holder: str) -> SessionHead | None:
        """Take the lease if it is free, expired or already `holder`'s; None when another holds it.

        Raises:
            UnknownSessionError: No session has this id.
        """
        now = self._clock()
        with self._db.transaction() as db:
            taken = rows_changed(
                db,
                update(SessionRow)
                .where(
                    SessionRow.id == session_id,
                    or_(
                        SessionRow.lease_holder.is_(None),
                        SessionRow.lease_expires_at < now,
                        SessionRow.lease_holder == holder,
                    ),
                )
                .values(lease_holder=holder, lease_expires_at=now + self.ttl),
            )
            row = db.get(SessionRow, session_id)
            if row is None:
                raise UnknownSessionError(session_id)
            if not taken:
                return None
            last = db.scalar(select(func.max(MessageRow.seq)).where(MessageRow.session_id == session_id))
            return SessionHead(row.version, last or 0)

    def renew(self, session_id: str, holder: str) -> bool:
        """Extend `holder`'s lease by `ttl`; False when it is no longer theirs."""
        now = self._clock()
        with self._db.transaction() as db:
            return bool(
                rows_changed(
                    db,
                    update(SessionRow)
                    .where(SessionRow.id == session_id, SessionRow.lease_holder == holder)
                    .values(lease_expires_at=now + self.ttl),
                )
            )

    def release(self, session_id: str, holder: str) -> None:
        """Free the lease if `holder` still has it."""
        with self._db.transaction() as db:
            rows_changed(
                db,
                update(SessionRow)
                .where(SessionRow.id == session_id, SessionRow.lease_holder == holder)
                .values(lease_holder=None, lease_expires_at=None),
            )

    @contextmanager
    def hold(self, session_id: str, wait_s: float = DEFAULT_LEASE_WAIT_S) -> Iterator[Lease]:
        """Hold the session's lease for the `with` block, waiting up to `wait_s` for another holder.

        Raises:
            SessionBusyError: another process kept the session for all of `wait_s`.
            UnknownSessionError: No session has this id.
        """
        holder = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        pause = _POLL_S[0]
        while (head := self.try_acquire(session_id, holder)) is None:
            if time.monotonic() + pause > deadline:
                raise SessionBusyError(session_id, wait_s)
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
        stop = threading.Event()
        keeper = threading.Thread(target=self._keep, args=(session_id, holder, stop), daemon=True)
        keeper.start()
        try:
            yield Lease(session_id, holder, head)
        finally:
            stop.set()
            keeper.join()
            self.release(session_id, holder)

    def _keep(self, session_id: str, holder: str, stop: threading.Event) -> None:
        """Renew every third of the ttl until stopped or the lease is lost (writes then fail)."""
        period = self.ttl.total_seconds() / 3
        while not stop.wait(period):
            try:
                if not self.renew(session_id, holder):
                    return
            except StorageBusyError:
                continue  # the ttl has slack for two more tries

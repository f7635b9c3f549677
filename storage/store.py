"""`SessionStore`: the session tier's repository of sessions, messages and facts.

Every method is one short transaction on its own database session, so a store can be
shared between threads. Methods return frozen records, never ORM rows. Writes touch the
session row *first*: on SQLite that takes the write lock before anything is read (no
stale read snapshot to upgrade), and on PostgreSQL it row-locks the session, so message
numbering and fact upserts cannot race.

It does not decide *when* a session should end or what its state means: the state is the
caller's, stored and returned as given, never read. Whoever writes the state says with it
whether the session is `pinned` (kept from expiring while that state stands, e.g. mid-flow).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import URL, Select, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from chatcache.storage.answers import AnswerEntries
from chatcache.storage.audits import AnswerAudits
from chatcache.storage.database import Database, rows_changed
from chatcache.storage.engine import default_data_dir, sqlite_url
from chatcache.storage.errors import (
    InvalidTextError,
    LeaseLostError,
    SessionClaimedError,
    SessionClosedError,
    SessionExistsError,
    StaleVersionError,
    UnknownSessionError,
)
from chatcache.storage.leases import TurnLeases
from chatcache.storage.models import FactRow, MessageRow, SessionRow
from chatcache.storage.records import ChatSession, Fact, FactKind, Message, Role, SessionStatus
from chatcache.storage.rules import AGENT_LENGTH, ID_LENGTH, TITLE_LENGTH, check_id, check_text

DEFAULT_TTL = timedelta(hours=24)
DEFAULT_BUSY_TIMEOUT = 5.0

_Query = TypeVar("_Query", bound=Select[Any])


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class SessionStore:
    """Persistent sessions with their messages, facts and dialogue state.

    Args:
        url: Any SQLAlchemy URL; see `SessionStore.open` for the default SQLite file.
        ttl: How long a session lives after its last activity.
        busy_timeout: Seconds a SQLite write waits for another writer.
        clock: Returns the current aware UTC time; tests pass a fake one.

    Attributes:
        ttl: How long a session lives after its last activity.
        location: The database file (or password-free URL), as named in errors.
        schema_version: The schema version the database was migrated to.

    Raises:
        ValueError: `ttl` is not positive or `busy_timeout` is negative.
        StorageConfigError: The URL is unusable or the database cannot be opened.
        StorageBusyError: Another process held the database during migration.
        SchemaVersionError: The database was written by a newer chatcache.
        CorruptDatabaseError: The database file is damaged or not a database.

    Every method checks its ids and text against `storage.rules` before it touches the
    database, raising `InvalidIdError` or `InvalidTextError`, so a value one backend would
    refuse is refused alike on all of them and nothing is half-written.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        ttl: timedelta = DEFAULT_TTL,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        self.ttl = ttl
        self._clock = clock
        self._db = Database(url, busy_timeout)
        self.location = self._db.location
        self.schema_version = self._db.schema_version
        self._leases = TurnLeases(self._db, clock)

    @classmethod
    def open(
        cls,
        data_dir: str | Path | None = None,
        *,
        ttl: timedelta = DEFAULT_TTL,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Callable[[], datetime] = _utc_now,
    ) -> SessionStore:
        """Open (creating if needed) `chatcache.db` in a data directory.

        Args:
            data_dir: Directory for the database; defaults to `$CHATCACHE_DATA_DIR`, else
                `~/.local/share/chatcache`.
            ttl: How long a session lives after its last activity.
            busy_timeout: Seconds a write waits for another writer.
            clock: Returns the current aware UTC time.

        Returns:
            A migrated, ready store.
        """
        directory = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        return cls(sqlite_url(directory), ttl=ttl, busy_timeout=busy_timeout, clock=clock)

    @property
    def leases(self) -> TurnLeases:
        """Turn leases of this database's sessions: one process answers a session at a time."""
        return self._leases

    @property
    def answers(self) -> AnswerEntries:
        """The answer cache's entries, in this same database."""
        return AnswerEntries(self._db)

    @property
    def answer_audits(self) -> AnswerAudits:
        """The answer cache's audits, in this same database (every replica's)."""
        return AnswerAudits(self._db)

    def close(self) -> None:
        """Close every pooled connection; records already returned stay valid."""
        self._db.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- sessions ---------------------------------------------------------------

    def create_session(
        self, session_id: str, user_id: str, bot: str, title: str | None = None
    ) -> ChatSession:
        """Start a new active session with an empty state.

        Args:
            session_id: Caller-chosen id, unique across all users.
            user_id: Who the session belongs to.
            bot: Which bot the user talks to.
            title: Display name for a UI, if any.

        Returns:
            The new session, at version 1.

        Raises:
            SessionExistsError: `session_id` is taken.
            InvalidIdError: An id breaks the rule in `storage.rules`.
            InvalidTextError: `title` holds a NUL or a lone surrogate, or is too long.
        """
        _check_new_session(session_id, user_id, bot, title)
        now = self._clock()
        row = SessionRow(
            id=session_id,
            user_id=user_id,
            bot=bot,
            title=title,
            status=SessionStatus.ACTIVE,
            version=1,
            state={},
            pinned=False,
            created_at=now,
            updated_at=now,
            expires_at=now + self.ttl,
        )
        try:
            with self._db.transaction() as db:
                db.add(row)
                db.flush()
                return row.record()
        except IntegrityError as exc:
            raise SessionExistsError(session_id) from exc

    def get_session(self, session_id: str) -> ChatSession:
        """Return the session, whatever its status.

        Raises:
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        with self._db.transaction() as db:
            return self._require(db, session_id).record()

    def get_or_create_session(self, session_id: str, user_id: str, bot: str) -> ChatSession:
        """Return the session, creating it if it does not exist yet.

        The returned session may have ended or expired; check `status` before writing.

        Raises:
            SessionExistsError: The id belongs to another user or bot.
        """
        return self.ensure_session(session_id, user_id, bot)[0]

    def ensure_session(self, session_id: str, user_id: str, bot: str) -> tuple[ChatSession, bool]:
        """The session, created if it does not exist yet, and whether this call created it (a
        caller that created a session for a turn it then refuses deletes it again).

        Raises:
            SessionExistsError: The id belongs to another user or bot.
        """
        try:
            session = self.get_session(session_id)
        except UnknownSessionError:
            try:
                return self.create_session(session_id, user_id, bot), True
            except SessionExistsError:  # another thread or process created it in between
                session = self.get_session(session_id)
        if (session.user_id, session.bot) != (user_id, bot):
            raise SessionExistsError(session_id, "belongs to another user or bot")
        return session, False

    def list_sessions(
        self,
        *,
        user_id: str | None = None,
        status: SessionStatus | str | None = None,
        limit: int | None = None,
    ) -> list[ChatSession]:
        """Return sessions, most recently active first.

        Args:
            user_id: Only this user's sessions.
            status: Only sessions with this status.
            limit: At most this many.
        """
        query = _filtered(select(SessionRow), user_id, status)
        query = query.order_by(SessionRow.updated_at.desc(), SessionRow.id).limit(limit)
        with self._db.transaction() as db:
            return [row.record() for row in db.scalars(query)]

    def count_sessions(
        self, *, user_id: str | None = None, status: SessionStatus | str | None = None
    ) -> int:
        """Count sessions, optionally of one user and/or one status."""
        query = _filtered(select(func.count()).select_from(SessionRow), user_id, status)
        with self._db.transaction() as db:
            return db.scalar(query) or 0

    def rename_session(self, session_id: str, title: str | None) -> ChatSession:
        """Set the display title; not activity, so order and expiry stay as they were."""
        if title is not None:
            check_text("session title", title, TITLE_LENGTH)
        return self._set(session_id, title=title)

    def claim_session(self, session_id: str, agent: str) -> ChatSession:
        """Let `agent` take the session over, unless another person already has.

        One compare-and-set UPDATE, so of two people (on any replicas) claiming at once exactly
        one wins; claiming again as the holder is a no-op. Not activity: order and expiry stay.

        Raises:
            SessionClaimedError: another person holds the session; `holder` names them.
            UnknownSessionError: No session has this id.
            InvalidTextError: `agent` is empty, over 64 characters or not storable.
        """
        check_id("session id", session_id)
        check_text("agent name", agent, AGENT_LENGTH)
        if not agent.strip():
            raise InvalidTextError("agent name", "is empty")
        free = (SessionRow.claimed_by.is_(None)) | (SessionRow.claimed_by == agent)
        with self._db.transaction() as db:
            changed = rows_changed(
                db, update(SessionRow).where(SessionRow.id == session_id, free).values(claimed_by=agent)
            )
            row = self._require(db, session_id)
            if changed == 0:
                raise SessionClaimedError(session_id, row.claimed_by or "")
            return row.record()

    def release_claim(self, session_id: str) -> ChatSession:
        """Clear whoever claimed the session (it went back to the bot)."""
        return self._set(session_id, claimed_by=None)

    def end_session(self, session_id: str) -> ChatSession:
        """Mark the session ended; its history stays readable but no longer accepts writes."""
        return self._set(session_id, status=SessionStatus.ENDED, updated_at=self._clock())

    def delete_session(self, session_id: str) -> None:
        """Delete the session with its messages and facts.

        Raises:
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        with self._db.transaction() as db:
            if rows_changed(db, delete(SessionRow).where(SessionRow.id == session_id)) == 0:
                raise UnknownSessionError(session_id)

    def update_state(
        self, session_id: str, new_state: Mapping[str, Any], expected_version: int, *, pinned: bool = False
    ) -> ChatSession:
        """Replace the session's state if nobody else changed it since it was read.

        Args:
            session_id: The session to update.
            new_state: The whole new state; must be JSON-serialisable.
            expected_version: The `version` of the session the caller read.
            pinned: Keep the session from expiring while this state stands.

        Returns:
            The session with the new state and `version` one higher.

        Raises:
            StaleVersionError: The stored version is not `expected_version`.
            SessionClosedError: The session has ended or expired.
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        now = self._clock()
        with self._db.transaction() as db:
            return self._replace_state(db, session_id, new_state, expected_version, pinned, now)

    def expire_sessions(self, now: datetime | None = None) -> list[str]:
        """Mark active sessions past their expiry as expired, except pinned ones.

        Args:
            now: The aware time to compare against; defaults to the store's clock.

        Returns:
            The ids of the sessions this call expired.
        """
        now = now if now is not None else self._clock()
        with self._db.transaction() as db:
            due = db.execute(
                select(SessionRow.id, SessionRow.version)
                .where(
                    SessionRow.status == SessionStatus.ACTIVE,
                    SessionRow.expires_at <= now,
                    SessionRow.pinned.is_(False),
                )
                .order_by(SessionRow.expires_at, SessionRow.id)
            ).all()
        expired = []
        # A second transaction, which writes first (see the module docstring); the version
        # guard skips any session whose state (and with it `pinned`) changed after the read above.
        with self._db.transaction() as db:
            for session_id, version in due:
                changed = rows_changed(
                    db,
                    update(SessionRow)
                    .where(
                        SessionRow.id == session_id,
                        SessionRow.version == version,
                        SessionRow.status == SessionStatus.ACTIVE,
                        SessionRow.expires_at <= now,
                    )
                    .values(status=SessionStatus.EXPIRED),
                )
                if changed:
                    expired.append(session_id)
        return expired

    # -- messages and facts -------------------------------------------------------

    def append_message(
        self,
        session_id: str,
        role: Role | str,
        content: str,
        token_count: int,
        meta: Mapping[str, Any] | None = None,
        *,
        reply_to: int | None = None,
        lease: str | None = None,
    ) -> Message:
        """Add a message after the session's last one and extend the session's life.

        Args:
            session_id: The session to add to.
            role: "system", "user" or "assistant".
            content: The message text.
            token_count: Tokens in `content`, as counted by the caller's tokenizer.
            meta: Optional JSON-serialisable extras (model name, latency, ...).
            reply_to: For a reply, the `seq` of the user message it answers.
            lease: The holder of the session's turn lease this write is made under
                (`SessionStore.leases`); the write is refused if the lease is no longer theirs.

        Returns:
            The stored message with its `seq`.

        Raises:
            SessionClosedError: The session has ended or expired.
            LeaseLostError: `lease` was given and another holder has the session now.
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        check_text("message", content)
        role = Role(role)
        if token_count < 0:
            raise ValueError(f"token_count must be >= 0, got {token_count}")
        now = self._clock()
        with self._db.transaction() as db:
            self._touch(db, session_id, now, lease)
            return self._insert_message(db, session_id, role, content, token_count, meta, reply_to, now)

    def withdraw_message(self, session_id: str, seq: int, *, lease: str | None = None) -> None:
        """Delete the session's last message, a user's message no reply names, as if it had never
        been sent: a turn refused after its message was recorded (the client is told to retry).

        Raises:
            ValueError: message `seq` is not the session's last, or not an unanswered user message.
            SessionClosedError: The session has ended or expired.
            LeaseLostError: `lease` was given and another holder has the session now.
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        with self._db.transaction() as db:
            self._touch(db, session_id, self._clock(), lease)
            last = db.scalar(select(MessageRow).where(MessageRow.session_id == session_id).order_by(MessageRow.seq.desc()).limit(1))
            if last is None or last.seq != seq or last.role != Role.USER:
                raise ValueError(f"session {session_id!r}: message {seq} is not its last message, a user's")
            db.delete(last)

    def messages(self, session_id: str, limit: int | None = None) -> list[Message]:
        """Return the session's messages oldest first; with `limit`, only the latest ones.

        Raises:
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        query = (
            select(MessageRow)
            .where(MessageRow.session_id == session_id)
            .order_by(MessageRow.seq.desc())
            .limit(limit)
        )
        with self._db.transaction() as db:
            rows = db.scalars(query).all()
            if not rows:
                self._require(db, session_id)
            return [row.record() for row in reversed(rows)]

    def upsert_fact(
        self,
        session_id: str,
        kind: FactKind | str,
        name: str,
        value: str,
        confidence: float,
        source_turn: int,
    ) -> Fact:
        """Record a fact, replacing any earlier fact of the same kind and name.

        Args:
            session_id: The session the fact was learned in.
            kind: "intent", "slot" or "preference".
            name: The fact's name within its kind, e.g. "destination".
            value: The fact's value as text.
            confidence: How sure the extractor is, from 0 to 1.
            source_turn: The message `seq` the fact came from.

        Returns:
            The stored fact.

        Raises:
            SessionClosedError: The session has ended or expired.
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        kind = _checked_fact(kind, name, value, confidence)
        now = self._clock()
        with self._db.transaction() as db:
            self._touch(db, session_id, now)
            return self._upsert_fact(db, session_id, kind, name, value, confidence, source_turn, now)

    def commit_turn(
        self,
        session_id: str,
        reply: str,
        token_count: int,
        meta: Mapping[str, Any] | None,
        *,
        reply_to: int,
        state: Mapping[str, Any],
        expected_version: int,
        pinned: bool = False,
        facts: Sequence[NewFact] = (),
        lease: str | None = None,
    ) -> CommittedTurn:
        """Store what a turn produced, all or nothing: the reply, the new state, the facts learned.

        A turn writes its user message when it arrives (`append_message`) and everything else
        here, in one transaction, so a turn that fails or loses its lease part way leaves the
        session as the user message found it.

        Args:
            session_id: The session the turn ran in.
            reply: The assistant's reply text; `token_count`, `meta` and `reply_to` as for
                `append_message`.
            state: The session's whole new state; written only if the stored version is
                still `expected_version`.
            pinned: Keep the session from expiring while this state stands.
            facts: Facts learned this turn, each replacing any of the same kind and name.
            lease: The turn lease this write is made under.

        Returns:
            The stored reply, the session with its new version and the facts as stored (ids
            and times), so the caller needs no second read to see what it wrote.

        Raises:
            StaleVersionError: Someone changed the state since the turn read it.
            LeaseLostError: `lease` was given and another holder has the session now.
            SessionClosedError: The session has ended or expired.
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        check_text("message", reply)
        if token_count < 0:
            raise ValueError(f"token_count must be >= 0, got {token_count}")
        checked = [(_checked_fact(f.kind, f.name, f.value, f.confidence), f) for f in facts]
        now = self._clock()
        with self._db.transaction() as db:
            self._touch(db, session_id, now, lease)
            message = self._insert_message(db, session_id, Role.ASSISTANT, reply, token_count, meta, reply_to, now)
            stored = [
                self._upsert_fact(db, session_id, kind, fact.name, fact.value, fact.confidence, fact.source_turn, now)
                for kind, fact in checked
            ]
            session = self._replace_state(db, session_id, state, expected_version, pinned, now)
            return CommittedTurn(message, session, stored)

    def facts(self, session_id: str) -> list[Fact]:
        """Return the session's facts ordered by kind, then name.

        Raises:
            UnknownSessionError: No session has this id.
        """
        check_id("session id", session_id)
        query = (
            select(FactRow)
            .where(FactRow.session_id == session_id)
            .order_by(FactRow.kind, FactRow.name)
        )
        with self._db.transaction() as db:
            rows = db.scalars(query).all()
            if not rows:
                self._require(db, session_id)
            return [row.record() for row in rows]

    # -- helpers --------------------------------------------------------------------

    def _replace_state(
        self,
        db: Session,
        session_id: str,
        new_state: Mapping[str, Any],
        expected_version: int,
        pinned: bool,
        now: datetime,
    ) -> ChatSession:
        # Compare-and-set: the WHERE clause is the lock, so no read can go stale.
        changed = rows_changed(
            db,
            update(SessionRow)
            .where(
                SessionRow.id == session_id,
                SessionRow.version == expected_version,
                SessionRow.status == SessionStatus.ACTIVE,
            )
            .values(
                state=dict(new_state),
                pinned=pinned,
                version=SessionRow.version + 1,
                updated_at=now,
                expires_at=now + self.ttl,
            ),
        )
        row = self._require(db, session_id)
        if changed == 0:
            if row.status != SessionStatus.ACTIVE:
                raise SessionClosedError(session_id, row.status)
            raise StaleVersionError(session_id, expected_version, row.version)
        return row.record()

    def _insert_message(
        self,
        db: Session,
        session_id: str,
        role: Role,
        content: str,
        token_count: int,
        meta: Mapping[str, Any] | None,
        reply_to: int | None,
        now: datetime,
    ) -> Message:
        last = db.scalar(select(func.max(MessageRow.seq)).where(MessageRow.session_id == session_id))
        if role == Role.USER and not db.scalar(
            select(func.count()).where(MessageRow.session_id == session_id, MessageRow.role == Role.USER)
        ):  # the first user message names a session nobody named (a sidebar lists it by its title)
            db.execute(
                update(SessionRow)
                .where(SessionRow.id == session_id, SessionRow.title.is_(None))
                .values(title=title_of(content) or None)
            )
        row = MessageRow(
            session_id=session_id,
            seq=(last or 0) + 1,
            role=role,
            content=content,
            token_count=token_count,
            created_at=now,
            meta=None if meta is None else dict(meta),
            reply_to=reply_to,
        )
        db.add(row)
        db.flush()
        return row.record()

    def _upsert_fact(
        self,
        db: Session,
        session_id: str,
        kind: FactKind,
        name: str,
        value: str,
        confidence: float,
        source_turn: int,
        now: datetime,
    ) -> Fact:
        row = db.scalar(
            select(FactRow).where(FactRow.session_id == session_id, FactRow.kind == kind, FactRow.name == name)
        )
        if row is None:
            row = FactRow(session_id=session_id, kind=kind, name=name)
            db.add(row)
        row.value = value
        row.confidence = confidence
        row.source_turn = source_turn
        row.created_at = now
        db.flush()
        return row.record()

    def _require(self, db: Session, session_id: str) -> SessionRow:
        row = db.get(SessionRow, session_id)
        if row is None:
            raise UnknownSessionError(session_id)
        return row

    def _touch(self, db: Session, session_id: str, now: datetime, lease: str | None = None) -> None:
        """Mark activity on an active session (held by `lease`, if given); the first write of every write method."""
        query = update(SessionRow).where(SessionRow.id == session_id, SessionRow.status == SessionStatus.ACTIVE)
        if lease is not None:
            query = query.where(SessionRow.lease_holder == lease)
        changed = rows_changed(db, query.values(updated_at=now, expires_at=now + self.ttl))
        if changed == 0:
            row = self._require(db, session_id)
            if row.status != SessionStatus.ACTIVE:
                raise SessionClosedError(session_id, row.status)
            raise LeaseLostError(session_id)

    def _set(self, session_id: str, **values: Any) -> ChatSession:
        check_id("session id", session_id)
        with self._db.transaction() as db:
            changed = rows_changed(
                db, update(SessionRow).where(SessionRow.id == session_id).values(**values)
            )
            if changed == 0:
                raise UnknownSessionError(session_id)
            return self._require(db, session_id).record()


@dataclass(frozen=True)
class NewFact:
    """A fact a turn learned, for `SessionStore.commit_turn`."""

    kind: FactKind | str
    name: str
    value: str
    confidence: float
    source_turn: int


@dataclass(frozen=True)
class CommittedTurn:
    """What `SessionStore.commit_turn` stored: the reply, the session at its new version, and the
    turn's facts as rows (each replaced any earlier fact of its kind and name)."""

    reply: Message
    session: ChatSession
    facts: list[Fact]


def title_of(first_message: str) -> str:
    """A session's title from its first message: one line, cut at a word near `TITLE_WORDS_AT`
    characters with an ellipsis, since a list of conversations shows a line each."""
    line = " ".join(first_message.split())
    if len(line) <= TITLE_WORDS_AT:
        return line
    cut = line[:TITLE_WORDS_AT]
    if " " in cut[TITLE_WORDS_AT // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:") + "…"


TITLE_WORDS_AT = 48  # what the app's 80-column sidebar and a phone's list show whole


def _checked_fact(kind: FactKind | str, name: str, value: str, confidence: float) -> FactKind:
    """The rules a fact must meet, checked before anything is written; returns its kind."""
    check_text("fact name", name, ID_LENGTH)
    check_text("fact value", value)
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be within [0, 1], got {confidence}")
    return FactKind(kind)


def _check_new_session(session_id: str, user_id: str, bot: str, title: str | None) -> None:
    """The rules a session's row must meet on every backend, checked before it is written."""
    check_id("session id", session_id)
    check_id("user id", user_id)
    check_id("bot", bot)
    if title is not None:
        check_text("session title", title, TITLE_LENGTH)


def _filtered(query: _Query, user_id: str | None, status: SessionStatus | str | None) -> _Query:
    if user_id is not None:
        check_id("user id", user_id)
        query = query.where(SessionRow.user_id == user_id)
    if status is not None:
        query = query.where(SessionRow.status == SessionStatus(status))
    return query

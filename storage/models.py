"""ORM tables of the session tier: sessions, their messages and their facts.

These classes describe the *current* schema and are what the store queries. They never
create tables: `storage.migrations` does, so that an existing database is upgraded step by
step instead of being silently out of date. A test checks that the two agree.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    LargeBinary,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from chatcache.storage.records import ChatSession, Fact, FactKind, Message, Role, SessionStatus

log = logging.getLogger("chatcache")


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware datetimes as naive UTC and hands them back aware.

    SQLite has no time zones, so without this a value would come back naive and no
    longer compare with `datetime.now(timezone.utc)`.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    """Declarative base holding the session tier's metadata."""


class SessionRow(Base):
    """A row of `sessions`."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_updated_at", "updated_at"),
        Index("ix_sessions_user_updated", "user_id", "updated_at"),
        Index("ix_sessions_status_expires", "status", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128))
    bot: Mapped[str] = mapped_column(String(128))
    title: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Which process is answering the session now, and until when (storage.leases).
    lease_holder: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Kept from expiring while its state stands (the owner of the state decides; see SessionStore).
    pinned: Mapped[bool] = mapped_column(Boolean)
    # The person answering the session since it was handed off (SessionStore.claim_session).
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)

    def record(self) -> ChatSession:
        """Copy this row into a value that outlives the database session."""
        return ChatSession(
            id=self.id,
            user_id=self.user_id,
            bot=self.bot,
            title=self.title,
            status=SessionStatus(self.status),
            version=self.version,
            state=dict(self.state),
            created_at=self.created_at,
            updated_at=self.updated_at,
            expires_at=self.expires_at,
            pinned=self.pinned,
            claimed_by=self.claimed_by,
        )


class MessageRow(Base):
    """A row of `messages`; the unique (session_id, seq) index also serves paging."""

    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_session_seq", "session_id", "seq", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("sessions.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # none_as_null: no meta is SQL NULL, not the JSON text 'null'.
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # The seq of the user message an assistant message answers; None for older rows.
    reply_to: Mapped[int | None] = mapped_column(Integer, nullable=True)

    def record(self) -> Message:
        """Copy this row into a value that outlives the database session."""
        return Message(
            id=self.id,
            session_id=self.session_id,
            seq=self.seq,
            role=Role(self.role),
            content=self.content,
            token_count=self.token_count,
            created_at=self.created_at,
            meta=_meta(self),
            reply_to=self.reply_to,
        )


def _meta(row: MessageRow) -> dict[str, Any] | None:
    """The row's meta as a mapping; a value that is not one (a tampered row) reads as none."""
    if row.meta is None or isinstance(row.meta, dict):
        return None if row.meta is None else dict(row.meta)
    log.warning("session %r message %d: its meta is not a JSON object; ignoring it", row.session_id, row.seq)
    return None


class FactRow(Base):
    """A row of `session_facts`; one per (session_id, kind, name)."""

    __tablename__ = "session_facts"
    __table_args__ = (UniqueConstraint("session_id", "kind", "name", name="uq_session_facts_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("sessions.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(Float)
    source_turn: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    def record(self) -> Fact:
        """Copy this row into a value that outlives the database session."""
        return Fact(
            id=self.id,
            session_id=self.session_id,
            kind=FactKind(self.kind),
            name=self.name,
            value=self.value,
            confidence=self.confidence,
            source_turn=self.source_turn,
            created_at=self.created_at,
        )


class AnswerEntryRow(Base):
    """A row of `answer_entries`: one cached answer and the question it answered."""

    __tablename__ = "answer_entries"
    __table_args__ = (
        Index("ix_answer_entries_scope_normalized", "scope", "normalized"),
        Index("ix_answer_entries_expires", "expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(64))
    intent: Mapped[str | None] = mapped_column(String(128), nullable=True)
    question: Mapped[str] = mapped_column(Text)
    normalized: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
    entropy_bits: Mapped[float] = mapped_column(Float)
    latency_ms: Mapped[float] = mapped_column(Float)
    prefetched: Mapped[bool] = mapped_column(Boolean)
    hits: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_hit_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AnswerAuditRow(Base):
    """A row of `answer_audits`: one served answer the model answered again, and whether they agreed.

    `entry_id` is not a foreign key: an audit is evidence about the cache's decisions and outlives
    the entry it checked (evicted or expired).
    """

    __tablename__ = "answer_audits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(64))
    entry_id: Mapped[int] = mapped_column(Integer)
    exact: Mapped[bool] = mapped_column(Boolean)
    similarity: Mapped[float] = mapped_column(Float)
    agreed: Mapped[bool] = mapped_column(Boolean)
    audited_at: Mapped[datetime] = mapped_column(UTCDateTime)

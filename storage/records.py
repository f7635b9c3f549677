"""Plain, frozen values returned by `SessionStore`.

They carry no database session, so callers may keep them after the store is closed and
pass them between threads. The enums are `str` subclasses, so they compare equal to their
plain values (`Role.USER == "user"`) and every method accepts either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any


class SessionStatus(str, Enum):
    """Where a session is in its life."""

    ACTIVE = "active"
    ENDED = "ended"
    EXPIRED = "expired"


class Role(str, Enum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class FactKind(str, Enum):
    """What a remembered fact about the conversation describes."""

    INTENT = "intent"
    SLOT = "slot"
    PREFERENCE = "preference"


@dataclass(frozen=True, slots=True)
class ChatSession:
    """One conversation between a user and a bot.

    `version` counts writes to `state`; pass it back to `SessionStore.update_state` so a
    concurrent change is detected instead of overwritten. `state` is the caller's, stored as
    given; `pinned` says the caller, writing it, kept the session from expiring;
    `claimed_by` names the person who took the session over once it was handed off.
    """

    id: str
    user_id: str
    bot: str
    title: str | None
    status: SessionStatus
    version: int
    state: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    pinned: bool = False
    claimed_by: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation; `seq` orders messages within their session from 1."""

    id: int
    session_id: str
    seq: int
    role: Role
    content: str
    token_count: int
    created_at: datetime
    meta: dict[str, Any] | None
    reply_to: int | None = None  # an assistant message: the seq of the user message it answers


@dataclass(frozen=True, slots=True)
class Fact:
    """Something learned in a session; at most one per (session, kind, name).

    `created_at` is when this value was recorded: a replacement resets it.
    """

    id: int
    session_id: str
    kind: FactKind
    name: str
    value: str
    confidence: float
    source_turn: int
    created_at: datetime

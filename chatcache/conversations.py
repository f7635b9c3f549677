"""Conversations in memory, backed by the session tier (the database is the record).

Every user message is written before the model runs and every reply after it, so a crash
loses at most the reply being generated. Memory holds what a turn needs at once: the
messages in prompt order (each reply with the exact ids it was generated as), where the
prompt window starts, and the rendered segments. A user message that never got a reply
(its turn failed) stays in the record but is left out of the prompt. A conversation not in
memory is rebuilt from the database, so a new process continues where the last one stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from storage import Fact, SessionStore, StaleVersionError

from .prompt import Message, RenderedSegments

CONTEXT_START = "context_start"  # state key: conversation messages before the prompt window


@dataclass
class Conversation:
    """One session's conversation as the engine uses it during a turn."""

    id: str
    system: Message | None
    turns: list[Message] = field(default_factory=list)
    context_start: int = 0
    segments: RenderedSegments = field(default_factory=RenderedSegments)
    facts: list[Fact] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window(self, start: int | None = None) -> list[Message]:
        """System message then the turns from `start` (default: the current window start)."""
        begin = self.context_start if start is None else start
        return ([self.system] if self.system else []) + self.turns[begin:]


def render_facts(system_prompt: str | None, facts: list[Fact]) -> str | None:
    """The system message: the bot's prompt, then what the session has confirmed, in a stable order."""
    if not facts:
        return system_prompt
    lines = [f"- {fact.kind.value} {fact.name}: {fact.value}" for fact in sorted(facts, key=lambda f: (f.kind, f.name))]
    known = "Confirmed in this conversation:\n" + "\n".join(lines)
    return f"{system_prompt}\n\n{known}" if system_prompt else known


class Conversations:
    """Loads, records and forgets conversations for one bot and user.

    `on_open` hears of every session opened, so the engine can bound what is in memory.
    """

    def __init__(
        self,
        store: SessionStore,
        bot: str,
        user_id: str,
        system_prompt: str | None,
        on_open: Callable[[str], None] = lambda session_id: None,
    ) -> None:
        self.store = store
        self.bot = bot
        self.user_id = user_id
        self.system_prompt = system_prompt
        self._on_open = on_open
        self._loaded: dict[str, Conversation] = {}
        self._lock = threading.Lock()

    def open(self, session_id: str, create: bool) -> Conversation:
        """The conversation of `session_id`, from memory or rebuilt from the database.

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        self._on_open(session_id)
        with self._lock:
            loaded = self._loaded.get(session_id)
            if loaded is not None:
                return loaded
        if create:
            session = self.store.get_or_create_session(session_id, self.user_id, self.bot)
        else:
            session = self.store.get_session(session_id)
        conversation = self._rebuild(session_id, session.state, session.version)
        with self._lock:
            return self._loaded.setdefault(session_id, conversation)

    def _rebuild(self, session_id: str, state: dict[str, Any], version: int) -> Conversation:
        facts = self.store.facts(session_id)
        turns: list[Message] = []
        pending: Message | None = None
        for record in self.store.messages(session_id):
            if record.role == "user":
                pending = Message("user", record.content)  # replaces an unanswered one
            elif record.role == "assistant" and pending is not None:
                ids = (record.meta or {}).get("token_ids")
                turns += [pending, Message("assistant", record.content, tuple(ids) if ids else None)]
                pending = None
        conversation = Conversation(session_id, system=None, turns=turns, facts=facts, state=dict(state), version=version)
        conversation.context_start = min(int(state.get(CONTEXT_START, 0)), len(turns))
        self._set_system(conversation)
        return conversation

    def _set_system(self, conversation: Conversation) -> None:
        content = render_facts(self.system_prompt, conversation.facts)
        conversation.system = Message("system", content) if content else None
        conversation.segments.ids.clear()

    def record_user(self, conversation: Conversation, text: str, tokens: int) -> str:
        """Store the user's message before anything can fail; returns an id for this turn."""
        message = self.store.append_message(conversation.id, "user", text, tokens)
        return f"{conversation.id}:{message.seq}"

    def record_reply(self, conversation: Conversation, user: Message, reply: Message, meta: dict[str, Any]) -> None:
        """Store the reply, then add the finished turn to the conversation in memory."""
        ids = list(reply.generated_ids or ())
        self.store.append_message(conversation.id, "assistant", reply.content, len(ids), {**meta, "token_ids": ids})
        conversation.turns += [user, reply]

    def move_context_start(self, conversation: Conversation, start: int) -> None:
        """Leave the turns before `start` out of the prompt from now on (and after a restart).

        The caller re-renders the segments of the new window.
        """
        if start == conversation.context_start:
            return
        conversation.context_start = start
        self.update_state(conversation, {CONTEXT_START: start})

    def update_state(self, conversation: Conversation, changes: dict[str, Any]) -> None:
        """Apply `changes` to the stored state with optimistic locking.

        A write that lost a race re-reads the session and applies the same changes on top of
        what the other writer stored, up to three times.
        """
        for _ in range(3):
            try:
                session = self.store.update_state(conversation.id, {**conversation.state, **changes}, conversation.version)
            except StaleVersionError:
                fresh = self.store.get_session(conversation.id)
                conversation.state, conversation.version = dict(fresh.state), fresh.version
                continue
            conversation.state, conversation.version = dict(session.state), session.version
            return
        raise StaleVersionError(conversation.id, conversation.version, self.store.get_session(conversation.id).version)

    def promote(self, conversation: Conversation, facts: list[tuple[str, str, str, float]], turn: int) -> None:
        """Write confirmed (kind, name, value, confidence) facts; the system message then shows them."""
        for kind, name, value, confidence in facts:
            self.store.upsert_fact(conversation.id, kind, name, value, confidence, turn)
        conversation.facts = self.store.facts(conversation.id)
        self._set_system(conversation)

    def forget(self, session_id: str) -> None:
        """Drop the in-memory copy; the next turn rebuilds it from the database."""
        with self._lock:
            self._loaded.pop(session_id, None)

    @contextmanager
    def hold(self, session_id: str, create: bool) -> Iterator[Conversation]:
        """The conversation of `session_id` with its lock held: one turn at a time, on the copy in memory.

        A copy dropped while this waited for its lock (let go of, or forgotten after a failed
        write) is not used: a later turn would rebuild another and run beside this one.
        """
        while True:
            conversation = self.open(session_id, create)
            with conversation.lock:
                with self._lock:
                    current = self._loaded.get(session_id) is conversation
                if current:
                    yield conversation
                    return

    def unload(self, session_id: str, release: Callable[[], None]) -> bool:
        """Drop an idle conversation from memory and call `release` while no turn can start on it.

        Returns False, having done nothing, while a turn holds the conversation.
        """
        with self._lock:
            conversation = self._loaded.get(session_id)
        if conversation is None:
            release()
            return True
        if not conversation.lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if self._loaded.get(session_id) is not conversation:
                    return False  # rebuilt meanwhile: a turn may hold the new copy
                del self._loaded[session_id]
            release()
        finally:
            conversation.lock.release()
        return True

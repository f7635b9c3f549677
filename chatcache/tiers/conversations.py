"""Conversations in memory, backed by the session tier (the database is the record).

A turn writes the session tier twice: its user message when it arrives (before the model
runs, so a crash loses at most the reply), and everything else it produced in one commit at
the end (`commit`: the reply, the dialogue state, where the prompt window starts, the facts it
confirmed). Until then those changes live only in the copy in memory; a turn that fails
drops that copy, so memory never runs ahead of the record. Memory holds what a turn needs at once: the
messages in prompt order (each reply with the exact ids it was generated as), where the
prompt window starts, and the rendered segments. A user message that never got a reply
(its turn failed) stays in the record but is left out of the prompt; each reply records the
seq of the question it answers. A conversation not in memory is rebuilt from the database,
so a new process continues where the last one stopped.

Several processes may serve one session (`chatcache ask`, app windows, workers): a turn holds
the session's lease in the database (`Conversations.turn`), so turns never interleave, and a
copy in memory that another process has changed since is rebuilt before the turn uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from datetime import datetime, timezone

from chatcache.dialog import DialogueState, dialogue_from_json, dialogue_to_json
from chatcache.storage import Fact, FactKind, NewFact, SessionHead, SessionStore
from chatcache.storage import Message as StoredMessage
from chatcache.storage.rules import text_problem

from ..errors import InvalidMessageError
from ..model.prompt import Message, RenderedSegments

CONTEXT_START = "context_start"  # state key: conversation messages before the prompt window
RESET_FROM = "reset_from"  # state key: the window's start before a drift reset the next turn may undo
DIALOGUE = "dialogue"  # state key: the dialogue state, as `dialogue_to_json` writes it

log = logging.getLogger("chatcache")


def stored_dialogue(session_id: str, state: Mapping[str, Any]) -> DialogueState | None:
    """The dialogue state a session's stored state holds; None if it holds none.

    An unreadable one (a tampered row) reads as none, with a warning: the conversation goes on
    from the start of its flow rather than failing every turn.
    """
    data = state.get(DIALOGUE)
    if data is None:
        return None
    try:
        if not isinstance(data, dict):
            raise TypeError(f"not a JSON object but {type(data).__name__}")
        return dialogue_from_json(data)
    except (TypeError, ValueError) as error:
        log.warning("session %r: its stored dialogue state is unreadable (%s); starting without one", session_id, error)
        return None


@dataclass
class Conversation:
    """One session's conversation as the engine uses it during a turn.

    Its session state is typed here and nowhere else: `dialogue` (the dialogue state
    machine's record), `context_start` (messages before the prompt window) and `reset_from` (the
    start before a drift reset, until the next informative turn confirms or undoes it);
    `stored_state` is what the session tier keeps of them, and `flow_active` whether it must
    keep the session from expiring meanwhile. `learned` holds the facts this turn confirmed,
    shown in `system` already and stored by the turn's commit.
    """

    id: str
    system: Message | None
    turns: list[Message] = field(default_factory=list)
    context_start: int = 0
    reset_from: int | None = None
    dialogue: DialogueState | None = None
    segments: RenderedSegments = field(default_factory=RenderedSegments)
    facts: list[Fact] = field(default_factory=list)
    learned: list[NewFact] = field(default_factory=list)
    version: int = 0
    last_seq: int = 0  # the newest stored message this copy has seen
    lease: str | None = None  # the turn lease's holder while a turn runs
    created_empty: bool = False  # its session row was created for this turn, which has recorded nothing yet

    def window(self, start: int | None = None) -> list[Message]:
        """System message then the turns from `start` (default: the current window start)."""
        begin = self.context_start if start is None else start
        return ([self.system] if self.system else []) + self.turns[begin:]

    @property
    def flow_active(self) -> bool:
        """A flow is half done: the session tier is told to keep the session (`pinned`) meanwhile."""
        return self.dialogue is not None and self.dialogue.flow_active

    def stored_state(self) -> dict[str, Any]:
        """The session state as the session tier keeps it (opaque to it)."""
        dialogue = dialogue_to_json(self.dialogue) if self.dialogue is not None else None
        return {DIALOGUE: dialogue, CONTEXT_START: self.context_start, RESET_FROM: self.reset_from}


def _window_start(session_id: str, stored: object, turns: int) -> int:
    """Where the prompt window starts, from the stored state; an unusable value starts it at 0.

    Starting at 0 loses nothing: laying out the next prompt drops the oldest turns again until
    it fits. A valid start is an even count (whole turns), at most the turns there are.
    """
    if type(stored) is int and stored >= 0 and stored % 2 == 0:
        return min(stored, turns)
    log.warning(
        "session %r: stored %s %r is not an even count of messages >= 0; starting the window at 0",
        session_id,
        CONTEXT_START,
        stored,
    )
    return 0


def check_storable(text: str, what: str = "The message") -> None:
    """Refuse text the session tier could not record (a NUL, a lone surrogate), before anything is.

    Raises:
        InvalidMessageError: `text` has such a character.
    """
    problem = text_problem(text)
    if problem is not None:
        raise InvalidMessageError(f"{what} {problem}: remove that character and send it again.")


def render_facts(system_prompt: str | None, facts: list[Fact]) -> str | None:
    """The system message: the bot's prompt, then what the session has confirmed, in a stable order."""
    if not facts:
        return system_prompt
    lines = [f"- {fact.kind.value} {fact.name}: {fact.value}" for fact in sorted(facts, key=lambda f: (f.kind, f.name))]
    known = "Confirmed in this conversation:\n" + "\n".join(lines)
    return f"{system_prompt}\n\n{known}" if system_prompt else known


class Conversations:
    """Loads and records conversations for one bot and user (the engine's `ResidentSessions`
    holds the loaded ones).

    `vocab_size` bounds the token ids a stored reply may carry (the model's embedding rows);
    without it only their type and sign are checked.
    """

    def __init__(
        self,
        store: SessionStore,
        bot: str,
        user_id: str,
        system_prompt: str | None,
        *,
        vocab_size: int | None = None,
    ) -> None:
        self.store = store
        self.bot = bot
        self.user_id = user_id
        self.system_prompt = system_prompt
        self.vocab_size = vocab_size

    def load(self, session_id: str, create: bool) -> Conversation:
        """The conversation of `session_id` as the session tier holds it (created first if `create`).

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        session, created = self.store.ensure_session(session_id, self.user_id, self.bot) if create else (self.store.get_session(session_id), False)
        conversation = self._rebuild(session_id, session.state, session.version)
        conversation.created_empty = created
        return conversation

    def _rebuild(self, session_id: str, state: dict[str, Any], version: int) -> Conversation:
        facts = self.store.facts(session_id)
        records = self.store.messages(session_id)
        asked: dict[int, Message] = {}  # user messages by seq, until answered
        turns: list[Message] = []
        pending: int | None = None  # the latest user message, for replies stored without reply_to
        for record in records:
            if record.role == "user":
                asked[record.seq] = Message("user", record.content)
                pending = record.seq
            elif record.role == "assistant":
                question = asked.pop(record.reply_to if record.reply_to is not None else pending or -1, None)
                pending = None
                if question is not None:
                    turns += [question, Message("assistant", record.content, self._generated_ids(record))]
        last_seq = records[-1].seq if records else 0
        context_start = _window_start(session_id, state.get(CONTEXT_START, 0), len(turns))
        reset_from = state.get(RESET_FROM)
        conversation = Conversation(
            session_id,
            system=None,
            turns=turns,
            context_start=context_start,
            reset_from=reset_from if type(reset_from) is int and 0 <= reset_from < context_start and reset_from % 2 == 0 else None,
            dialogue=stored_dialogue(session_id, state),
            facts=facts,
            version=version,
            last_seq=last_seq,
        )
        self._set_system(conversation)
        return conversation

    @contextmanager
    def turn(self, conversation: Conversation) -> Iterator[bool]:
        """Hold the session's turn lease for one turn; yields whether the copy was rebuilt first.

        The caller holds the session's lock (`SessionMemory.lock`: this process's other
        threads); the lease keeps other processes out. A copy that another process changed since it was loaded is
        rebuilt in place, so the turn sees every message and state change stored so far.

        Raises:
            SessionBusyError: another process kept the session longer than the lease wait.
        """
        with self.store.leases.hold(conversation.id) as lease:
            stale = lease.head != SessionHead(conversation.version, conversation.last_seq)
            if stale:
                fresh = self.read(conversation.id)
                for name in (f.name for f in fields(Conversation) if f.name != "id"):
                    setattr(conversation, name, getattr(fresh, name))
            conversation.lease = lease.holder
            try:
                yield stale
            finally:
                conversation.lease = None

    def read(self, session_id: str) -> Conversation:
        """The conversation as stored now, without touching the copy in memory (another process may write it).

        Raises:
            UnknownSessionError: the session does not exist.
        """
        session = self.store.get_session(session_id)
        return self._rebuild(session_id, session.state, session.version)

    def _generated_ids(self, record: StoredMessage) -> tuple[int, ...] | None:
        """The ids a stored reply was generated as, or None to encode its text instead.

        The text is the record of what was said; the ids only let the token tier see the reply
        exactly as generated. Ids the model cannot take (a tampered row, another model's
        vocabulary) would crash it mid-forward, so they are dropped with a warning and the text
        is encoded: the conversation goes on, losing only that reply's exact tokenization.
        """
        ids = (record.meta or {}).get("token_ids")
        if not ids:
            return None
        bound = self.vocab_size
        if isinstance(ids, list) and all(type(i) is int and 0 <= i and (bound is None or i < bound) for i in ids):
            return tuple(ids)
        log.warning(
            "session %r message %d: its stored token ids are not ids of this model; using its text instead",
            record.session_id,
            record.seq,
        )
        return None

    def _set_system(self, conversation: Conversation) -> None:
        content = render_facts(self.system_prompt, conversation.facts)
        conversation.system = Message("system", content) if content else None
        conversation.segments.ids.clear()

    def record_user(self, conversation: Conversation, text: str, tokens: int) -> int:
        """Store the user's message before anything can fail; returns its seq, which the reply names."""
        message = self.store.append_message(conversation.id, "user", text, tokens, lease=conversation.lease)
        conversation.last_seq, conversation.created_empty = message.seq, False
        return message.seq

    def withdraw_user(self, conversation: Conversation, seq: int, created: bool) -> None:
        """Take back the user's message `seq`, the session's last, that a refused turn recorded:
        the session is as it was before (`created` if this turn created it)."""
        self.store.withdraw_message(conversation.id, seq, lease=conversation.lease)
        conversation.last_seq, conversation.created_empty = seq - 1, created  # a message's seq is its predecessor's plus one

    def discard_if_created_empty(self, conversation: Conversation) -> None:
        """Delete the session again if this turn created it and recorded nothing (refused, or
        failed before its first write): a refused first message leaves no session behind. Called
        with the turn lease held, so no other process can have written to it."""
        if conversation.created_empty:
            self.store.delete_session(conversation.id)

    def commit(
        self, conversation: Conversation, user: Message, user_seq: int, reply: Message, meta: dict[str, Any]
    ) -> None:
        """Store the turn's reply to the user message `user_seq` with everything else the turn
        changed (state, facts) in one transaction, then add the finished turn in memory.

        Raises:
            StaleVersionError: the stored state changed during the turn, outside its lease.
            LeaseLostError: another process holds the session now.
        """
        ids = list(reply.generated_ids or ())
        committed = self.store.commit_turn(
            conversation.id,
            reply.content,
            len(ids),
            {**meta, "token_ids": ids},
            reply_to=user_seq,
            state=conversation.stored_state(),
            expected_version=conversation.version,
            pinned=conversation.flow_active,
            facts=conversation.learned,
            lease=conversation.lease,
        )
        conversation.version, conversation.last_seq = committed.session.version, committed.reply.seq
        conversation.turns += [user, reply]
        stored = {(fact.kind, fact.name): fact for fact in committed.facts}  # a fact promoted twice: its last row
        conversation.facts = [f for f in conversation.facts if (f.kind, f.name) not in stored] + list(stored.values())
        conversation.learned = []

    def store_state(self, conversation: Conversation) -> None:
        """Store the conversation's state outside a turn's commit (a person handed it back).

        Raises:
            StaleVersionError: the stored state changed since the copy was read.
        """
        session = self.store.update_state(
            conversation.id, conversation.stored_state(), conversation.version, pinned=conversation.flow_active
        )
        conversation.version = session.version

    def promote(self, conversation: Conversation, facts: list[tuple[str, str, str, float]], turn: int) -> None:
        """Confirm (kind, name, value, confidence) facts: the system message shows them from this
        turn on, and the turn's commit stores them."""
        now = datetime.now(timezone.utc)
        for kind, name, value, confidence in facts:
            conversation.learned.append(NewFact(kind, name, value, confidence, turn))
            replaced = [f for f in conversation.facts if (f.kind.value, f.name) != (kind, name)]
            conversation.facts = [*replaced, Fact(0, conversation.id, FactKind(kind), name, value, confidence, turn, now)]
        self._set_system(conversation)

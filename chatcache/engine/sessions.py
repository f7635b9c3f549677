"""A user's sessions with one bot, as the apps and the server see them, and what each holds in memory.

The session tier stores a session (its messages, facts and dialogue state); in memory a
session is one `SessionMemory` (its conversation copy, drift topic and turn-tier entries) and
its KV in the token tier. `Sessions` is the one way in and out for all of it: a turn opens a
session here (`ResidentSessions`, which applies the memory bound), and a session that ends,
expires or idles past the bound is let go of here, as one. A person answering a handed-off
session (`agent_reply`, `hand_back`) goes through here too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from chatcache.dialog import DialogueEvent, DialogueState, DialogueStateMachine, EventType, State
from chatcache.storage import ChatSession, Fact, SessionStore
from chatcache.storage import Message as StoredMessage

from ..errors import InvalidMessageError
from ..model.prompt import Message, PromptRenderer
from ..config import MemoryConfig
from ..steering.handoff import handoff_summary
from ..steering.session_memory import SessionMemory
from ..tiers.conversations import Conversation, Conversations, check_storable, stored_dialogue
from ..tiers.token_tier import TokenTier
from ..tiers.turn_tier import TurnTierConfig
from .memory import ResidentSessions


class Sessions:
    """The sessions of one user with one bot: in the session tier and in this process's memory.

    Args:
        store: the session tier.
        conversations: loads and records the sessions' conversations.
        token_tier: the sessions' KV; None on a remote model, whose KV is its server's.
        turn_tier: the settings of each session's turn-tier entries.
        renderer: the model's prompt renderer (an agent's reply is stored with its token count).
        memory: how many sessions, idle for how long, keep their state in memory.
    """

    def __init__(
        self,
        store: SessionStore,
        conversations: Conversations,
        token_tier: TokenTier | None,
        turn_tier: TurnTierConfig,
        renderer: PromptRenderer,
        memory: MemoryConfig,
    ) -> None:
        self.store = store
        self.conversations = conversations
        self._token_tier = token_tier
        self._renderer = renderer
        self._resident = ResidentSessions(memory, conversations, turn_tier, token_tier, self.expire)

    # -- what the apps and the server ask --------------------------------------------

    @property
    def user_id(self) -> str:
        return self.conversations.user_id

    @property
    def bot(self) -> str:
        """The bot's name in the session tier (a shipped bot's, a file's stem, "custom" or "default")."""
        return self.conversations.bot

    def create(self, session_id: str, title: str | None = None) -> ChatSession:
        """Start a session of this user and bot before its first message.

        Raises:
            SessionExistsError: the id is taken.
        """
        return self.store.create_session(session_id, self.conversations.user_id, self.conversations.bot, title)

    def get(self, session_id: str) -> ChatSession:
        """The session's record (title, status, dialogue state).

        Raises:
            UnknownSessionError: no such session.
        """
        return self.store.get_session(session_id)

    def all(self) -> list[ChatSession]:
        """This user's sessions in the session tier, most recently active first."""
        return self.store.list_sessions(user_id=self.conversations.user_id)

    def is_mine(self, session: ChatSession) -> bool:
        """Whether a stored session belongs to this user and bot."""
        return (session.user_id, session.bot) == (self.conversations.user_id, self.conversations.bot)

    @staticmethod
    def dialogue_state(session: ChatSession) -> State | None:
        """The dialogue state a stored session is in (HANDED_OFF: a person answers it); None for
        one without (a plain chatbot's, or an unreadable record). Read from the record as given,
        so a list of sessions costs no further database reads, and no engine is needed for it."""
        dialogue = stored_dialogue(session.id, session.state)
        return dialogue.state if dialogue is not None else None

    @staticmethod
    def handoff_summary(messages: list[StoredMessage], facts: list[Fact]) -> str:
        """What a person taking a session over reads first, from its stored messages and facts
        (the caller has read them): the intents recognised, the facts confirmed and the
        customer's last messages (`steering/handoff.py`)."""
        return handoff_summary(messages, facts)

    def in_memory(self, session_id: str) -> bool:
        """Whether this process holds the session in memory (then it exists); never reads the database."""
        return self._resident.loaded(session_id) is not None

    def held_in_memory(self) -> list[str]:
        """What this process holds in memory, least recently used first: the sessions' ids and the
        KV keys of conversations callers keep (`ChatEngine.complete`), which the memory bound
        (`MemoryConfig`) counts and lets go of alike."""
        return self._resident.keys()

    @property
    def memory(self) -> MemoryConfig:
        """The bounds on what sessions hold in memory (and on a reply stream nobody reads)."""
        return self._resident.config

    def rename(self, session_id: str, title: str | None) -> ChatSession:
        """Set (or with None clear) the session's display title.

        Raises:
            UnknownSessionError: no such session.
            InvalidIdError: a title too long or not storable.
        """
        return self.store.rename_session(session_id, title)

    def history(self, session_id: str) -> list[Message]:
        """The session's answered turns, oldest first, including those out of the prompt window.

        Raises:
            UnknownSessionError: no such session in the session tier.
        """
        return list(self.conversations.read(session_id).turns)

    def records(self, session_id: str) -> list[StoredMessage]:
        """Every stored message of the session with what it was stored with (tier, timings,
        an agent's name), oldest first; a user message still unanswered too.

        Raises:
            UnknownSessionError: no such session.
        """
        return self.store.messages(session_id)

    def end(self, session_id: str) -> None:
        """End a session in the session tier and let go of what it holds.

        Raises:
            UnknownSessionError: no such session in the session tier.
        """
        self.store.end_session(session_id)
        self.release(session_id)

    def delete(self, session_id: str) -> None:
        """Delete a session with its messages and facts, and let go of what it holds.

        Raises:
            UnknownSessionError: no such session.
        """
        self.store.delete_session(session_id)
        self.release(session_id)

    def clear_caches(self) -> None:
        """Let go of every session's KV and turn-tier entries; each one's next turn recomputes
        its context (the terminal app's "clear caches")."""
        if self._token_tier is not None:  # a remote model's KV is its server's
            self._token_tier.clear()
        for memory in self._resident.sessions():
            memory.entries.clear()

    def close(self) -> None:
        """Spill every session's KV to disk and close the session tier: the next process on the
        same data directory continues each conversation from the one and restores its KV from the other."""
        if self._token_tier is not None:
            self._token_tier.spill_all()
        self.store.close()

    def expire(self) -> list[str]:
        """Expire idle sessions in the session tier and let go of what they held; also drop
        turn-tier entries past their TTL in sessions that go on (periodic upkeep)."""
        expired = self.store.expire_sessions()
        for session_id in expired:
            self.release(session_id)
        for memory in self._resident.sessions():
            memory.entries.purge_expired()
        return expired

    # -- a person's side of a handed-off session ---------------------------------------

    def agent_reply(self, session_id: str, text: str, agent: str) -> None:
        """Record a person's reply in a session handed off to them; the bot stays silent there.

        Raises:
            UnknownSessionError: no such session.
            InvalidMessageError: the session is not handed off, or `text` is empty or not storable.
        """
        if not text.strip():
            raise InvalidMessageError("The reply is empty.")
        check_storable(text, "The agent's reply")
        with self.hold(session_id, create=False) as memory, self.conversations.turn(memory.conversation):
            conversation = memory.conversation
            _handed_off(conversation)
            messages = self.store.messages(session_id)
            answered = {m.reply_to for m in messages if m.role.value == "assistant"}
            waiting = [m.seq for m in messages if m.role.value == "user" and m.seq not in answered]
            meta = {"tier": "agent", "agent": agent, "dialogue_state": State.HANDED_OFF.value}
            self.store.append_message(
                session_id, "assistant", text, len(self._renderer.encode_text(text)), meta,
                reply_to=waiting[-1] if waiting else None, lease=conversation.lease,
            )  # fmt: skip
            self._resident.forget(session_id)  # rebuilt with the person's turn on the next one

    def hand_back(self, session_id: str) -> None:
        """A person hands a session back to the bot: the dialogue starts over, the history stays.

        Raises:
            UnknownSessionError: no such session.
            InvalidMessageError: the session is not handed off.
        """
        with self.hold(session_id, create=False) as memory, self.conversations.turn(memory.conversation):
            conversation = memory.conversation
            machine = DialogueStateMachine.restore(_handed_off(conversation))
            machine.apply(DialogueEvent(EventType.RESET, event_id=f"{session_id}:{conversation.last_seq}:hand-back"))
            conversation.dialogue = machine.snapshot()
            self.conversations.store_state(conversation)
            self._resident.forget(session_id)  # its topic and entries were the flow's

    # -- what a turn holds -------------------------------------------------------------

    def hold(self, session_id: str, create: bool) -> AbstractContextManager[SessionMemory]:
        """The session's memory with its lock held (`ResidentSessions.hold`), counted as used now.

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        return self._resident.hold(session_id, create)

    def hold_kv(self, key: str) -> AbstractContextManager[None]:
        """The KV key of a conversation the caller keeps, with its lock held (`ResidentSessions.hold_kv`)."""
        return self._resident.hold_kv(key)

    def open(self, session_id: str, create: bool) -> SessionMemory:
        """The session's memory without its lock (a background reader takes it itself).

        Raises:
            UnknownSessionError: `create` is false and the session does not exist.
        """
        return self._resident.open(session_id, create)

    def loaded(self, session_id: str) -> SessionMemory | None:
        """The session's memory if this process holds it; never reads the database."""
        return self._resident.loaded(session_id)

    def forget(self, session_id: str) -> None:
        """Drop the session's memory: what a turn changed there was never stored (it failed or
        was refused), so the next turn rebuilds it from the session tier."""
        self._resident.forget(session_id)

    def release(self, session_id: str) -> None:
        """Free what a session holds in memory and on disk (it ended, expired or was deleted)."""
        self._resident.release(session_id)


def _handed_off(conversation: Conversation) -> DialogueState:
    """The session's dialogue state, which must be HANDED_OFF.

    Raises:
        InvalidMessageError: the bot answers this session.
    """
    if conversation.dialogue is None or conversation.dialogue.state != State.HANDED_OFF:
        raise InvalidMessageError("This session is not handed off to a person; the bot answers it.")
    return conversation.dialogue

"""The records a turn passes through its steps (`turns.TurnPipeline`): the turn as its caller
asked it, and what each step decided (`Received`, `Understanding`, `Served`). The steps read
them and return new ones; nothing here runs a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from chatcache.dialog import ActionOutcome

from ..answer_cache import AnswerScope
from ..config import GenerationConfig
from ..errors import InvalidMessageError
from ..model.prompt import Message, PromptRenderer
from ..reply import TurnStats
from ..steering.hcac import TurnContext
from ..steering.session_memory import SessionMemory
from ..tiers.conversations import Conversation, check_storable

Admit = Callable[[int, bool, float], None]
"""Admission control for one turn: called with the prompt tokens the model would have to
prefill, whether the token tier has the memory for the turn now (else it would wait for a
running turn to end) and the seconds a restore of the session's KV from disk would take,
before the model runs; it raises to refuse the turn (the server's 429)."""


@dataclass
class Turn:
    """One user turn as the caller asked it; the steps read it and return what they decide."""

    session_id: str  # also the token tier's entry: the session, or the given conversation's key
    params: GenerationConfig
    started: float
    user: Message
    given: Conversation | None = None  # the conversation the caller keeps (`complete`), before `user`: nothing is recorded
    prefix: list[int] | None = None  # the shared system-prompt ids to start from (default: the engine's)
    renderer: PromptRenderer | None = None  # lays out a given conversation (default: the engine's; one with tools)
    bot: str | None = None  # the answer cache's bot fingerprint (default: the engine's)
    admit: Admit | None = None
    stats: TurnStats = field(default_factory=TurnStats)  # how it was served, counted as it is (the model runner's too)

    @classmethod
    def for_session(cls, session_id: str, text: str, params: GenerationConfig, admit: Admit | None) -> Turn:
        """A session's turn on `text`, which is checked now, before anything runs.

        Raises:
            InvalidMessageError: empty text, or text no database can store.
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidMessageError("The message is empty: type something to send.")
        check_storable(text)
        return cls(session_id, params, time.perf_counter(), Message("user", text), admit=admit)

    @property
    def text(self) -> str:
        return self.user.content


@dataclass(frozen=True)
class Received:
    """What the receive step holds the turn to: the conversation it answers, the session's
    memory (None for a conversation the caller keeps) and the seq of the user's message."""

    conversation: Conversation
    memory: SessionMemory | None
    user_seq: int
    created_session: bool = False  # this turn created its session (one refused deletes it again)

    @property
    def turn_id(self) -> str:
        """The turn's id (dialogue events, action idempotency): the same for every retry of it."""
        return f"{self.conversation.id}:{self.user_seq}"


@dataclass(frozen=True)
class Understanding:
    """What the understand step read: the dialogue's and drift's verdict, and the answer cache's scope."""

    context: TurnContext
    scope: AnswerScope | None


@dataclass(frozen=True)
class Served:
    """What the serve step decided (the turn's stats say who answers): the reply's pieces, which
    the turn streams to its reader, and the reply they make (`reply`)."""

    pieces: Iterator[str]
    text: str | None = None  # a flow's, an action's or a cached reply: known before its pieces
    generated: list[Message] = field(default_factory=list)  # the model's: the runner hands it over as it stops
    action: ActionOutcome | None = None  # the flow's action this turn performed

    def reply(self, read_to_end: bool) -> Message | None:
        """The reply once the pieces have stopped: the model's keeps what it generated, also for
        a reader who stopped reading; any other is the reply only if it was read to the end."""
        if self.generated:
            return self.generated[0]
        return Message("assistant", self.text) if self.text is not None and read_to_end else None

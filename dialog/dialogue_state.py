"""The dialogue state: one typed record of where a conversation stands in its flow.

`DialogueStateMachine` produces it (`snapshot`) and is restored from it (`restore`); everyone
else reads its fields. `dialogue_to_json` and `dialogue_from_json` are the one place it becomes
JSON-able data and back, so whoever stores it (the session tier) keeps an opaque value and
never reads a key of it. `flow_active` is derived from `state`, so it is not serialised: a rule
that depends on it (a session mid-flow must not expire) is decided by the record's owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class State(str, Enum):
    IDLE = "IDLE"
    COLLECTING_SLOTS = "COLLECTING_SLOTS"
    CONFIRMING = "CONFIRMING"
    ACTING = "ACTING"
    HANDED_OFF = "HANDED_OFF"
    DONE = "DONE"


FLOW_STATES = frozenset({State.COLLECTING_SLOTS, State.CONFIRMING, State.ACTING})
"""States in which a flow is under way (a form half filled, a booking half made)."""


@dataclass(frozen=True)
class DialogueState:
    """One conversation's position in its flow, as the state machine left it.

    Attributes:
        state: Where the flow stands.
        intent: The flow's intent, if one is under way or just ended.
        confidence: How sure the classifier was of `intent`.
        slots: The slot values given so far, by name.
        required: The slots the flow needs, in the order it asks for them.
        needs_confirmation: The flow asks the user to confirm before it acts.
        confirmed: The user confirmed the current slot values.
        version: How many events changed the state.
        last_event: The fingerprint of the last event applied (a replay of it is ignored).
        waiting: The second request of a message that made two, not offered yet.
        offered: That second request once offered, until the user's next message.
    """

    state: State = State.IDLE
    intent: str | None = None
    confidence: float = 0.0
    slots: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    needs_confirmation: bool = False
    confirmed: bool = False
    version: int = 0
    last_event: str | None = None
    waiting: str | None = None
    offered: str | None = None

    @property
    def flow_active(self) -> bool:
        """True while a flow is under way, so its session must not be expired now."""
        return self.state in FLOW_STATES

    @property
    def missing_slots(self) -> list[str]:
        """Required slots still unfilled, in the order the flow asks for them."""
        return [name for name in self.required if name not in self.slots]


def dialogue_to_json(dialogue: DialogueState) -> dict[str, Any]:
    """The record as JSON-able data, for whoever stores it (read back with `dialogue_from_json`)."""
    return {
        "state": dialogue.state.value,
        "intent": dialogue.intent,
        "confidence": dialogue.confidence,
        "slots": dict(dialogue.slots),
        "required": list(dialogue.required),
        "needs_confirmation": dialogue.needs_confirmation,
        "confirmed": dialogue.confirmed,
        "version": dialogue.version,
        "last_event": dialogue.last_event,
        "waiting": dialogue.waiting,
        "offered": dialogue.offered,
    }


def dialogue_from_json(data: Mapping[str, Any]) -> DialogueState:
    """The record `dialogue_to_json` wrote; a missing field takes its default, and a stored
    `flow_active` (older sessions carry one) is ignored: it is derived from `state`.

    Raises:
        ValueError: `data` names no known state.
    """
    return DialogueState(
        state=State(data["state"]) if "state" in data else State.IDLE,
        intent=data.get("intent"),
        confidence=float(data.get("confidence", 0.0)),
        slots=dict(data.get("slots", {})),
        required=tuple(data.get("required", [])),
        needs_confirmation=bool(data.get("needs_confirmation", False)),
        confirmed=bool(data.get("confirmed", False)),
        version=int(data.get("version", 0)),
        last_event=data.get("last_event"),
        waiting=data.get("waiting"),
        offered=data.get("offered"),
    )

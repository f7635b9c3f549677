"""The dialogue state machine: where a conversation stands in a bot's flow, and how it moves.

The machine knows states and events, not bots: an INTENT_DETECTED event carries what the
flow requires (slots, a confirmation), so a stored state can be advanced by anyone holding the
event, e.g. a retry loop that reloads the state after losing an optimistic-lock race.

Which events a state accepts is a table; where an accepted event leads is decided by what
the flow still lacks (slots, then confirmation, then the action). The machine is restored from
a `DialogueState` record and hands one back (`snapshot`), so the persistence layer stores a
typed record and compare-and-sets on `version`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .dialogue_state import FLOW_STATES, DialogueState, State


class EventType(str, Enum):
    INTENT_DETECTED = "INTENT_DETECTED"  # payload: intent, confidence, slots, required, confirm
    SLOT_FILLED = "SLOT_FILLED"  # payload: slots
    CONFIRMED = "CONFIRMED"
    DENIED = "DENIED"
    ACTED = "ACTED"
    HAND_OFF = "HAND_OFF"  # payload (optional): intent, confidence
    RESET = "RESET"
    OUT_OF_SCOPE = "OUT_OF_SCOPE"
    OFFERED = "OFFERED"  # the bot offered the waiting second request ("shall I go on with that?")


_ANY_TIME = {EventType.HAND_OFF, EventType.RESET}
TRANSITIONS: Mapping[State, frozenset[EventType]] = {
    State.IDLE: frozenset({EventType.INTENT_DETECTED, EventType.OUT_OF_SCOPE, EventType.OFFERED, *_ANY_TIME}),
    State.COLLECTING_SLOTS: frozenset(
        {EventType.SLOT_FILLED, EventType.INTENT_DETECTED, EventType.OUT_OF_SCOPE, *_ANY_TIME}
    ),
    State.CONFIRMING: frozenset(
        {EventType.CONFIRMED, EventType.DENIED, EventType.SLOT_FILLED, EventType.INTENT_DETECTED}
        | {EventType.OUT_OF_SCOPE, *_ANY_TIME}
    ),
    State.ACTING: frozenset({EventType.ACTED, EventType.OFFERED, *_ANY_TIME}),
    State.HANDED_OFF: frozenset({EventType.RESET}),
    State.DONE: frozenset({EventType.INTENT_DETECTED, EventType.OUT_OF_SCOPE, EventType.OFFERED, *_ANY_TIME}),
}
"""Events each state accepts; anything else raises `IllegalTransitionError`."""

_NOT_THE_USER = {EventType.ACTED, EventType.OFFERED}  # events of the bot's own turn, not of a user's message


class IllegalTransitionError(Exception):
    """An event arrived in a state that does not accept it."""

    def __init__(self, state: State, event: EventType) -> None:
        allowed = ", ".join(sorted(e.value for e in TRANSITIONS[state]))
        super().__init__(f"event {event.value} is not allowed in state {state.value} (allowed: {allowed})")
        self.state = state
        self.event = event


@dataclass(frozen=True)
class DialogueEvent:
    """Something that happened in the conversation; `event_id` tells two equal-looking events apart."""

    type: EventType
    payload: Mapping[str, Any] = field(default_factory=dict)
    event_id: str | None = None

    def fingerprint(self) -> str:
        """What identifies a replay: the event id if there is one, else type and payload.

        The id wins because a retried turn may derive its event from a newer state (and so
        a different payload), yet it is still the same turn.
        """
        if self.event_id is not None:
            return f"id:{self.event_id}"
        body = json.dumps([self.type.value, dict(self.payload)], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


class DialogueStateMachine:
    """One conversation's position in its flow, advanced one event at a time.

    Besides the flow, it keeps the second request of a message that made two (`waiting`: its
    text, carried by INTENT_DETECTED as "waiting"), which outlives the first flow however that
    ends; once offered (OFFERED) it is `offered`, and the user's next message answers the offer
    or moves on: any event of a user's message drops it.
    """

    def __init__(self) -> None:
        self.state = State.IDLE
        self.intent: str | None = None
        self.confidence = 0.0
        self.slots: dict[str, str] = {}
        self.required: list[str] = []
        self.needs_confirmation = False
        self.confirmed = False
        self.version = 0
        self.last_event: str | None = None
        self.waiting: str | None = None
        self.offered: str | None = None

    @property
    def missing_slots(self) -> list[str]:
        """Required slots still unfilled, in the order the flow asks for them."""
        return [name for name in self.required if name not in self.slots]

    def apply(self, event: DialogueEvent) -> bool:
        """Advance by one event.

        Args:
            event: The event to apply.

        Returns:
            True if the state changed (and `version` went up); False if the event is a
            replay of the last one applied, which is ignored.

        Raises:
            IllegalTransitionError: The current state does not accept this event type.
        """
        fingerprint = event.fingerprint()
        if fingerprint == self.last_event:
            return False
        if event.type not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(self.state, event.type)
        if event.type not in _NOT_THE_USER:
            self.offered = None
        self._handlers[event.type](self, event.payload)
        self.last_event = fingerprint
        self.version += 1
        return True

    def _intent_detected(self, payload: Mapping[str, Any]) -> None:
        self._start(payload)
        self.slots = dict(payload.get("slots", {}))
        self.required = list(payload.get("required", []))
        self.needs_confirmation = bool(payload.get("confirm", False))
        if payload.get("waiting"):
            self.waiting = str(payload["waiting"])
        self._advance()

    def _slot_filled(self, payload: Mapping[str, Any]) -> None:
        self.slots.update(payload["slots"])
        self.confirmed = False  # a changed value has to be confirmed again
        self._advance()

    def _confirmed(self, payload: Mapping[str, Any]) -> None:
        self.confirmed = True
        self._advance()

    def _denied(self, payload: Mapping[str, Any]) -> None:
        self._clear(State.IDLE)

    def _acted(self, payload: Mapping[str, Any]) -> None:
        self.state = State.DONE

    def _offered(self, payload: Mapping[str, Any]) -> None:
        self.offered, self.waiting = self.waiting, None

    def _hand_off(self, payload: Mapping[str, Any]) -> None:
        if "intent" in payload:
            self._start(payload)
        self.state = State.HANDED_OFF

    def _reset(self, payload: Mapping[str, Any]) -> None:
        self._clear(State.IDLE)

    def _out_of_scope(self, payload: Mapping[str, Any]) -> None:
        # Mid-flow the bot re-asks its question; between flows nothing is being discussed.
        if self.state not in FLOW_STATES:
            self._clear(State.IDLE)

    def _start(self, payload: Mapping[str, Any]) -> None:
        self._clear(self.state)
        self.intent = str(payload["intent"])
        self.confidence = float(payload.get("confidence", 0.0))

    def _clear(self, state: State) -> None:
        self.state, self.intent, self.confidence = state, None, 0.0
        self.slots, self.required, self.needs_confirmation, self.confirmed = {}, [], False, False

    def _advance(self) -> None:
        if self.missing_slots:
            self.state = State.COLLECTING_SLOTS
        elif self.needs_confirmation and not self.confirmed:
            self.state = State.CONFIRMING
        else:
            self.state = State.ACTING

    _handlers: Mapping[EventType, Callable[[DialogueStateMachine, Mapping[str, Any]], None]] = {
        EventType.INTENT_DETECTED: _intent_detected,
        EventType.SLOT_FILLED: _slot_filled,
        EventType.CONFIRMED: _confirmed,
        EventType.DENIED: _denied,
        EventType.ACTED: _acted,
        EventType.HAND_OFF: _hand_off,
        EventType.RESET: _reset,
        EventType.OUT_OF_SCOPE: _out_of_scope,
        EventType.OFFERED: _offered,
    }

    def snapshot(self) -> DialogueState:
        """The state as a record (see `restore`)."""
        return DialogueState(
            state=self.state,
            intent=self.intent,
            confidence=self.confidence,
            slots=dict(self.slots),
            required=tuple(self.required),
            needs_confirmation=self.needs_confirmation,
            confirmed=self.confirmed,
            version=self.version,
            last_event=self.last_event,
            waiting=self.waiting,
            offered=self.offered,
        )

    @classmethod
    def restore(cls, dialogue: DialogueState) -> DialogueStateMachine:
        """A machine standing where `snapshot` left one."""
        machine = cls()
        machine.state = dialogue.state
        machine.intent = dialogue.intent
        machine.confidence = dialogue.confidence
        machine.slots = dict(dialogue.slots)
        machine.required = list(dialogue.required)
        machine.needs_confirmation = dialogue.needs_confirmation
        machine.confirmed = dialogue.confirmed
        machine.version = dialogue.version
        machine.last_event = dialogue.last_event
        machine.waiting = dialogue.waiting
        machine.offered = dialogue.offered
        return machine


def apply_with_retry(
    load: Callable[[], tuple[DialogueState, int]],
    save: Callable[[DialogueState, int], None],
    event: DialogueEvent,
    stale_error: type[Exception],
    attempts: int = 3,
) -> DialogueState:
    """Apply an event under optimistic locking, reloading and reapplying when beaten to it.

    Args:
        load: Returns the stored state and the version to compare-and-set against.
        save: Stores a new state only if the stored version still equals the given one;
            raises `stale_error` otherwise.
        event: The event to apply. Because replays are no-ops, reapplying after a save that
            in fact succeeded is harmless.
        stale_error: The exception type `save` raises on a version conflict.
        attempts: How many load-apply-save rounds to try.

    Returns:
        The state as saved (or as loaded, if the event was already applied).

    Raises:
        stale_error: Still stale after `attempts` rounds.
        IllegalTransitionError: The freshly loaded state does not accept the event.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(attempts):
        stored, version = load()
        machine = DialogueStateMachine.restore(stored)
        if not machine.apply(event):
            return stored
        new = machine.snapshot()
        try:
            save(new, version)
        except stale_error:
            if attempt == attempts - 1:
                raise
            continue
        return new
    raise AssertionError("unreachable")

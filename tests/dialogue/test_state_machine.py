"""The dialogue state machine: legal paths, illegal events, replays, versions, retries."""

from __future__ import annotations

import json

import pytest

from chatcache.dialog import (
    DialogueEvent,
    DialogueState,
    DialogueStateMachine,
    EventType,
    IllegalTransitionError,
    State,
    apply_with_retry,
    dialogue_from_json,
    dialogue_to_json,
)

TRANSFER = DialogueEvent(
    EventType.INTENT_DETECTED,
    {"intent": "transfer_money", "confidence": 0.9, "slots": {}, "required": ["amount", "to_account"], "confirm": True},
    "turn-1",
)


def stored(machine: DialogueStateMachine) -> DialogueStateMachine:
    """The machine restored from its record as a store keeps it: serialised to JSON text and back."""
    return DialogueStateMachine.restore(dialogue_from_json(json.loads(json.dumps(dialogue_to_json(machine.snapshot())))))


def run(*events: DialogueEvent) -> DialogueStateMachine:
    machine = DialogueStateMachine()
    for event in events:
        machine.apply(event)
    return machine


def test_full_flow_collects_slots_confirms_acts_and_finishes() -> None:
    machine = DialogueStateMachine()
    seen = [machine.state]
    for event in [
        TRANSFER,
        DialogueEvent(EventType.SLOT_FILLED, {"slots": {"amount": "200"}}, "turn-2"),
        DialogueEvent(EventType.SLOT_FILLED, {"slots": {"to_account": "12345674"}}, "turn-3"),
        DialogueEvent(EventType.CONFIRMED, event_id="turn-4"),
        DialogueEvent(EventType.ACTED, event_id="act-1"),
    ]:
        machine.apply(event)
        seen.append(machine.state)
    assert seen == [
        State.IDLE, State.COLLECTING_SLOTS, State.COLLECTING_SLOTS, State.CONFIRMING, State.ACTING, State.DONE
    ]
    assert machine.slots == {"amount": "200", "to_account": "12345674"}
    assert machine.intent == "transfer_money" and machine.confirmed
    assert machine.version == 5


def test_flow_active_only_while_a_flow_is_under_way() -> None:
    machine = DialogueStateMachine()
    assert machine.snapshot().flow_active is False
    machine.apply(TRANSFER)
    assert machine.snapshot().flow_active is True
    machine.apply(DialogueEvent(EventType.RESET, event_id="r"))
    assert machine.state == State.IDLE and machine.snapshot().flow_active is False
    assert machine.intent is None and machine.slots == {}


def test_intent_with_all_slots_and_no_confirmation_goes_straight_to_acting() -> None:
    event = DialogueEvent(EventType.INTENT_DETECTED, {"intent": "check_balance", "confidence": 0.99})
    assert run(event).state == State.ACTING


def test_denial_cancels_the_flow() -> None:
    filled = DialogueEvent(EventType.SLOT_FILLED, {"slots": {"amount": "5", "to_account": "12345674"}})
    machine = run(TRANSFER, filled, DialogueEvent(EventType.DENIED))
    assert machine.state == State.IDLE and machine.intent is None


def test_illegal_transition_names_state_and_event() -> None:
    machine = DialogueStateMachine()
    with pytest.raises(IllegalTransitionError, match="CONFIRMED is not allowed in state IDLE") as info:
        machine.apply(DialogueEvent(EventType.CONFIRMED))
    assert info.value.state == State.IDLE and info.value.event == EventType.CONFIRMED
    assert machine.version == 0
    handed = run(DialogueEvent(EventType.HAND_OFF, {"intent": "talk_to_human"}))
    with pytest.raises(IllegalTransitionError, match="INTENT_DETECTED is not allowed in state HANDED_OFF"):
        handed.apply(TRANSFER)


def test_same_event_twice_is_a_no_op() -> None:
    machine = run(TRANSFER)
    before = machine.snapshot()
    assert machine.apply(TRANSFER) is False
    assert machine.snapshot() == before
    # A replayed confirmation must not be rejected as illegal once the flow moved on.
    machine.apply(DialogueEvent(EventType.SLOT_FILLED, {"slots": {"amount": "1", "to_account": "12345674"}}))
    confirm = DialogueEvent(EventType.CONFIRMED, event_id="t9")
    assert machine.apply(confirm) is True
    assert machine.apply(confirm) is False
    assert machine.state == State.ACTING


def test_equal_payload_with_a_new_event_id_is_a_new_event() -> None:
    machine = run(DialogueEvent(EventType.OUT_OF_SCOPE, event_id="a"))
    assert machine.apply(DialogueEvent(EventType.OUT_OF_SCOPE, event_id="b")) is True
    assert machine.version == 2


def test_every_effective_transition_increments_version() -> None:
    machine = DialogueStateMachine()
    versions = []
    for event in [TRANSFER, TRANSFER, DialogueEvent(EventType.OUT_OF_SCOPE, event_id="x")]:
        machine.apply(event)
        versions.append(machine.version)
    assert versions == [1, 1, 2]


def test_the_state_record_round_trips_through_json() -> None:
    machine = run(TRANSFER, DialogueEvent(EventType.SLOT_FILLED, {"slots": {"amount": "200"}}))
    data = json.loads(json.dumps(dialogue_to_json(machine.snapshot())))
    assert set(data) >= {"state", "intent", "confidence", "slots", "version"}
    assert "flow_active" not in data  # derived from the state, so stored nowhere
    restored = DialogueStateMachine.restore(dialogue_from_json(data))
    assert restored.snapshot() == machine.snapshot()
    assert restored.missing_slots == ["to_account"] and restored.snapshot().flow_active


def test_a_state_stored_with_flow_active_loads() -> None:
    """Sessions stored before the record existed carry a `flow_active` key; it is derived, not read."""
    data = {**dialogue_to_json(run(TRANSFER).snapshot()), "flow_active": False}
    assert dialogue_from_json(data) == run(TRANSFER).snapshot() and dialogue_from_json(data).flow_active


class Stale(Exception):
    pass


class Store:
    """A compare-and-set store that reports a conflict on the first `conflicts` saves."""

    def __init__(self, conflicts: int) -> None:
        self.state = DialogueStateMachine().snapshot()
        self.conflicts = conflicts
        self.loads = 0

    def load(self) -> tuple[DialogueState, int]:
        self.loads += 1
        return self.state, self.state.version

    def save(self, state: DialogueState, expected: int) -> None:
        if self.conflicts:
            self.conflicts -= 1
            # Someone else wrote meanwhile: the stored version moved on.
            other = DialogueStateMachine.restore(self.state)
            other.apply(DialogueEvent(EventType.OUT_OF_SCOPE, event_id=f"other-{self.conflicts}"))
            self.state = other.snapshot()
            raise Stale
        assert expected == self.state.version
        self.state = state


def test_apply_with_retry_reloads_and_reapplies_after_stale_saves() -> None:
    store = Store(conflicts=2)
    saved = apply_with_retry(store.load, store.save, TRANSFER, Stale, attempts=3)
    assert store.loads == 3
    assert saved == store.state
    assert saved.state == State.COLLECTING_SLOTS and saved.version == 3  # two others, then ours


def test_apply_with_retry_gives_up_after_the_attempts() -> None:
    store = Store(conflicts=5)
    with pytest.raises(Stale):
        apply_with_retry(store.load, store.save, TRANSFER, Stale, attempts=3)
    assert store.loads == 3
    assert store.state.intent is None


def test_apply_with_retry_skips_saving_an_already_applied_event() -> None:
    store = Store(conflicts=0)
    apply_with_retry(store.load, store.save, TRANSFER, Stale)
    store.conflicts = 1  # a save now would fail, but a replay needs none
    assert apply_with_retry(store.load, store.save, TRANSFER, Stale, attempts=1).version == 1


def test_same_event_id_is_a_replay_even_with_another_payload() -> None:
    machine = run(TRANSFER)
    retry = DialogueEvent(EventType.OUT_OF_SCOPE, {"text": "derived from the newer state"}, "turn-1")
    assert machine.apply(retry) is False and machine.version == 1


def test_a_waiting_second_request_and_its_offer_survive_the_round_trip() -> None:
    waiting = DialogueEvent(EventType.INTENT_DETECTED, {**TRANSFER.payload, "slots": {"amount": "5", "to_account": "12345674"}, "confirm": False, "waiting": "block my card"}, "t1")
    machine = run(waiting)
    assert (machine.state, machine.waiting, machine.offered) == (State.ACTING, "block my card", None)
    restored = stored(machine)
    assert restored.waiting == "block my card" and restored.snapshot() == machine.snapshot()
    restored.apply(DialogueEvent(EventType.OFFERED, event_id="t1:offered"))
    restored.apply(DialogueEvent(EventType.ACTED, event_id="t1:acted"))  # the bot's own turn keeps the offer
    again = stored(restored)
    assert (again.state, again.waiting, again.offered) == (State.DONE, None, "block my card")
    again.apply(DialogueEvent(EventType.OUT_OF_SCOPE, event_id="t2"))  # the user's next message drops it
    assert again.offered is None and again.snapshot().offered is None


def test_a_waiting_request_outlives_its_flow_however_it_ends() -> None:
    machine = run(DialogueEvent(EventType.INTENT_DETECTED, {**TRANSFER.payload, "waiting": "block my card"}, "t1"))
    machine.apply(DialogueEvent(EventType.RESET, event_id="t2"))
    assert machine.state == State.IDLE and machine.waiting == "block my card"


def test_a_state_saved_before_offers_existed_loads() -> None:
    old = {k: v for k, v in dialogue_to_json(run(TRANSFER).snapshot()).items() if k not in ("waiting", "offered")}
    restored = DialogueStateMachine.restore(dialogue_from_json(old))
    assert restored.waiting is None and restored.offered is None and restored.missing_slots == ["amount", "to_account"]

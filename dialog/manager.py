"""One user turn through the dialogue layer: classify, extract slots, step the state machine.

The manager turns text into exactly one event per turn and says what the bot should do next
(ask for a slot, ask for confirmation, perform an action, give the flow's fixed response, the
knowledge base's answer or the bot's fallback to what no intent fits, or nothing special).
Mid-flow, a new value corrects a slot ("no, make it 300" re-asks the confirmation), "never
mind" calls the flow off, and a question with a curated answer (opening hours during a
transfer) is a digression: answered, then the flow asks its question again. It does not perform actions:
when a decision carries an `action`, the caller performs it and then applies an ACTED event,
e.g. with `apply_with_retry`. A turn in a state that takes no user input (ACTING, HANDED_OFF)
raises `IllegalTransitionError`; the caller routes such turns elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .classifier import IntentReader, PreviousTurn, read_in_context
from .definition import OUT_OF_SCOPE, BotDefinition, Flow
from .slots import SlotExtractor
from .state_machine import DialogueEvent, DialogueStateMachine, EventType, State

_YES = re.compile(r"\b(yes|yeah|yep|yup|sure|correct|confirm(ed)?|ok(ay)?|go ahead|do it|please do)\b", re.I)
HANDOFF_REPLY = "I am handing you over to a person from our team; they will answer you here."
"""What the bot says when a flow hands the conversation to a person, unless the flow says otherwise."""
_NO = re.compile(r"\b(no|nope|nah|cancel|don'?t|do not|stop|wrong)\b", re.I)
_CANCEL = re.compile(r"\b(never ?mind|forget (it|that|about it)|cancel( (that|it|this))?|stop|leave it)\b", re.I)
CANCELLED_REPLY = "All right, I have not done it. Is there anything else I can help you with?"
"""What the bot says when the user calls a flow off (a "no" to its confirmation, "never mind" mid-flow)."""


@dataclass(frozen=True)
class TurnDecision:
    """What one user turn resolved to.

    Attributes:
        state: The new dialogue state dict, to be saved.
        intent: The intent the conversation is about now ("out_of_scope" if none).
        confidence: The classifier confidence the intent was detected with.
        confirmed: The user confirmed the flow, or the confidence exceeded `promote_threshold`.
        prompt: What the bot says, if the flow says it: the next question (a missing slot or the
            confirmation), or the fixed response of a flow without an action.
        cacheable: Answers to this intent may be served from the answer cache.
        action: The flow's action to perform now, when the flow reached ACTING.
    """

    state: dict[str, Any]
    intent: str
    confidence: float
    confirmed: bool
    prompt: str | None
    cacheable: bool
    action: str | None


class DialogueManager:
    """Drives a bot's flows from user text, holding no per-conversation state itself."""

    def __init__(self, bot: BotDefinition, classifier: IntentReader, promote_threshold: float = 0.95) -> None:
        """Args:
        bot: The bot whose flows to run.
        classifier: Recognises the bot's intents.
        promote_threshold: Classifier confidence above which an intent counts as confirmed
            without asking the user.
        """
        if not 0.0 <= promote_threshold <= 1.0:
            raise ValueError(f"promote_threshold must be in [0, 1], got {promote_threshold}")
        self.bot = bot
        self.classifier = classifier
        self.promote_threshold = promote_threshold
        self._extractor = SlotExtractor(bot)

    def handle(
        self,
        state: dict[str, Any] | None,
        text: str,
        turn_id: str | None = None,
        embedding: np.ndarray | None = None,
        previous_text: str | None = None,
    ) -> TurnDecision:
        """Process one user turn.

        Args:
            state: The conversation's state dict, or None for a new conversation.
            text: What the user said.
            turn_id: A unique id of this turn (e.g. the message id); it makes a retried turn
                a no-op instead of a second event.
            embedding: the text's unit-norm embedding, if the caller already computed it.
            previous_text: the user's previous message: a follow-up that leans on it ("and
                how much does it cost?") is read in its light (`read_in_context`).

        Returns:
            The decision, including the new state.

        Raises:
            IllegalTransitionError: The conversation is in a state that takes no user turn.
        """
        machine = DialogueStateMachine.from_dict(state) if state else DialogueStateMachine()
        previous = PreviousTurn(previous_text, machine.intent) if previous_text and machine.intent else None
        event, digression = self._event(machine, text, turn_id, embedding, previous)
        machine.apply(event)
        response = self._fixed_response(machine, turn_id)
        if event.type == EventType.OUT_OF_SCOPE and machine.state == State.IDLE:
            response = self.bot.fallback  # no intent fits and no flow is asking: the bot's own answer, if it has one
        if event.type in (EventType.DENIED, EventType.RESET):
            response = CANCELLED_REPLY
        if digression is not None:  # a question answered mid-flow; the flow asks again where it was
            response = f"{digression}\n\n{self._question(machine, self.bot.flow(machine.intent or OUT_OF_SCOPE))}"
        return self._decide(machine, response)

    def _fixed_response(self, machine: DialogueStateMachine, turn_id: str | None) -> str | None:
        """The bot's own reply once the flow may act and there is no action to run: the flow's
        response, or the knowledge base's answer to a question intent; the flow is done.

        An answer is given once the classifier accepts the intent, not only when it confirms it:
        the curated answer of the likely intent beats what a small model writes (measured on the
        bank bot's stories: the bundled model, the answers in its context, looped)."""
        if machine.state != State.ACTING or machine.intent is None:
            return None
        flow, intent = self.bot.flow(machine.intent), self.bot.intent(machine.intent)
        if flow.action is not None:
            return None
        if flow.response is not None:
            reply = flow.response.format(**machine.slots)
        elif intent.answer is not None:
            reply = intent.answer  # curated text, not a template
        else:
            return None
        machine.apply(DialogueEvent(EventType.ACTED, event_id=f"{turn_id}:responded" if turn_id else None))
        return reply

    def _event(
        self,
        machine: DialogueStateMachine,
        text: str,
        turn_id: str | None,
        embedding: np.ndarray | None,
        previous: PreviousTurn | None,
    ) -> tuple[DialogueEvent, str | None]:
        """The turn's one event, and the curated answer of a question asked mid-flow (a
        digression: the flow stays where it is)."""
        if machine.state in (State.COLLECTING_SLOTS, State.CONFIRMING) and machine.intent is not None:
            # A changed value first: "no, make it 300" corrects the amount, it does not call the transfer off.
            found = self._extractor.extract(text, self.bot.intent(machine.intent).slots)
            changed = {k: v for k, v in found.items() if machine.slots.get(k) != v}
            if changed:
                return DialogueEvent(EventType.SLOT_FILLED, {"slots": changed}, turn_id), None
            if machine.state == State.CONFIRMING:
                # "no" is checked first: "no, don't do it" contains "do it".
                if _NO.search(text):
                    return DialogueEvent(EventType.DENIED, event_id=turn_id), None
                if _YES.search(text):
                    return DialogueEvent(EventType.CONFIRMED, event_id=turn_id), None
            if _CANCEL.search(text):
                return DialogueEvent(EventType.RESET, event_id=turn_id), None
            result = self.classifier.classify(text, embedding)
            other = self.bot.intent(result.intent) if result.intent not in (OUT_OF_SCOPE, machine.intent) else None
            if other is not None and other.answer is not None:
                return DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), other.answer
            if other is not None:
                return self._detected(result.intent, result.confidence, text, turn_id), None
            return DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), None
        result = read_in_context(self.classifier, text, previous, embedding)
        if result.intent == OUT_OF_SCOPE:
            return DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text, "confidence": result.confidence}, turn_id), None
        return self._detected(result.intent, result.confidence, text, turn_id), None

    def _detected(self, intent: str, confidence: float, text: str, turn_id: str | None) -> DialogueEvent:
        flow = self.bot.flow(intent)
        if flow.hand_off:
            return DialogueEvent(EventType.HAND_OFF, {"intent": intent, "confidence": confidence}, turn_id)
        payload = {
            "intent": intent,
            "confidence": confidence,
            "slots": self._extractor.extract(text, self.bot.intent(intent).slots),
            "required": self.bot.intent(intent).slots,
            "confirm": flow.confirm is not None,
        }
        return DialogueEvent(EventType.INTENT_DETECTED, payload, turn_id)

    def _decide(self, machine: DialogueStateMachine, response: str | None) -> TurnDecision:
        intent = machine.intent if machine.intent is not None else OUT_OF_SCOPE
        flow = self.bot.flow(intent) if intent != OUT_OF_SCOPE else None
        return TurnDecision(
            state=machine.to_dict(),
            intent=intent,
            confidence=machine.confidence,
            confirmed=machine.confirmed or machine.confidence > self.promote_threshold,
            prompt=response if response is not None else self._question(machine, flow),
            cacheable=intent != OUT_OF_SCOPE and self.bot.intent(intent).cacheable,
            action=flow.action if flow is not None and machine.state == State.ACTING else None,
        )

    @staticmethod
    def _question(machine: DialogueStateMachine, flow: Flow | None) -> str | None:
        """What the flow asks next (a missing slot, the confirmation), or says as it hands off."""
        if flow is not None and machine.state == State.COLLECTING_SLOTS:
            return flow.ask[machine.missing_slots[0]]
        if flow is not None and machine.state == State.CONFIRMING and flow.confirm is not None:
            return flow.confirm.format(**machine.slots)
        if machine.state == State.HANDED_OFF:  # just handed off: `handle` takes no turn there
            return (flow.response if flow is not None else None) or HANDOFF_REPLY
        return None

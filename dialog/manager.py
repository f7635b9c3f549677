"""One user turn through the dialogue layer: classify, extract slots, step the state machine.

The manager turns text into exactly one event per turn and says what the bot should do next
(ask for a slot, ask for confirmation, perform an action, give the flow's fixed response, the
knowledge base's answer or the bot's fallback to what no intent fits, or nothing special).
Mid-flow, a new value corrects a slot ("no, make it 300" re-asks the confirmation), "never
mind" calls the flow off, and a question with a curated answer (opening hours during a
transfer) is a digression: answered, then the flow asks its question again. A value the bot
refuses (dollars where it sends euros, an amount of -50) is said to be refused, and why, and
asked for again. A decline ("I don't want to block my card") starts nothing, and a message with
two requests gets both: the second's curated answer at once, or the second offered once the
first is done ("You also asked about ...: shall I go on with that?"); see `dialog.requests`
for which messages are read so. It does not perform actions:
when a decision carries an `action`, the caller performs it and then applies an ACTED event,
e.g. with `apply_with_retry`. A turn in a state that takes no user input (ACTING, HANDED_OFF)
raises `IllegalTransitionError`; the caller routes such turns elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from .classifier import PROMOTE_THRESHOLD, IntentReader, IntentResult, PreviousTurn, read_in_context
from .definition import OUT_OF_SCOPE, BotDefinition, Flow
from .requests import declined, two_requests
from .slots import SlotExtractor
from .dialogue_state import DialogueState, State
from .state_machine import DialogueEvent, DialogueStateMachine, EventType

_YES = re.compile(r"\b(yes|yeah|yep|yup|sure|correct|confirm(ed)?|ok(ay)?|go ahead|do it|please do)\b", re.I)
HANDOFF_REPLY = "I am handing you over to a person from our team; they will answer you here."
"""What the bot says when a flow hands the conversation to a person, unless the flow says otherwise."""
_NO = re.compile(r"\b(no|nope|nah|cancel|don'?t|do not|stop|wrong)\b", re.I)
_CANCEL = re.compile(r"\b(never ?mind|forget (it|that|about it)|cancel( (that|it|this))?|stop|leave it)\b", re.I)
CANCELLED_REPLY = "All right, I have not done it. Is there anything else I can help you with?"
"""What the bot says when the user calls a flow off (a "no" to its confirmation, "never mind" mid-flow)."""
DECLINED = "All right, I will not do that."
DECLINED_REPLY = f"{DECLINED} Is there anything else I can help you with?"
"""What the bot says to a decline ("I don't want to block my card", `dialog.requests`): nothing starts."""
NOT_A_NUMBER = "Please give the amount in figures, for example 50 or 12.50."
"""Said before the question again when a flow asks for an amount and the answer has no number."""
OFFER = "You also asked about {request}: shall I go on with that?"
"""The second request of a message that made two, offered once the first is done."""
OFFER_REFUSED_REPLY = "All right. Is there anything else I can help you with?"
_OFFER_TAKEN = re.compile(r"^\W*(yes|yeah|yep|sure|ok(ay)?|please|go on|go ahead)\b(?!.*\b(no|not|don'?t)\b)", re.I)
_OFFER_REFUSED = re.compile(r"^\W*(no|nope|nah|not now)\b[\w\s,]{0,20}$", re.I)
_ASKING = {State.COLLECTING_SLOTS, State.CONFIRMING}
"""States in which the flow waits for the user's answer to its question."""


@dataclass(frozen=True)
class _Reading:
    """What a user's message comes to: the one event it applies, and what the bot says besides
    the flow's own words: `preface` before them (a digression's answer, why a value was
    refused), `also` the answer to the message's second request, `reply` instead of them."""

    event: DialogueEvent
    preface: str | None = None
    also: str | None = None
    reply: str | None = None


def _joined(*parts: str | None) -> str | None:
    said = [part for part in parts if part]
    return "\n\n".join(said) if said else None


@dataclass(frozen=True)
class TurnDecision:
    """What one user turn resolved to.

    Attributes:
        state: The new dialogue state, to be saved.
        intent: The intent the conversation is about now ("out_of_scope" if none).
        confidence: The classifier confidence the intent was detected with.
        confirmed: The user confirmed the flow, or the confidence exceeded `promote_threshold`.
        prompt: What the bot says, if the flow says it: the next question (a missing slot or the
            confirmation), or the fixed response of a flow without an action. With an `action`,
            what the bot says after the action's reply (the answer to, or the offer of, the
            message's second request), or None.
        cacheable: Answers to this intent may be served from the answer cache.
        action: The flow's action to perform now, when the flow reached ACTING.
    """

    state: DialogueState
    intent: str
    confidence: float
    confirmed: bool
    prompt: str | None
    cacheable: bool
    action: str | None


class DialogueManager:
    """Drives a bot's flows from user text, holding no per-conversation state itself."""

    def __init__(self, bot: BotDefinition, classifier: IntentReader, promote_threshold: float = PROMOTE_THRESHOLD) -> None:
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
        state: DialogueState | None,
        text: str,
        turn_id: str | None = None,
        embedding: np.ndarray | None = None,
        previous_text: str | None = None,
    ) -> TurnDecision:
        """Process one user turn.

        Args:
            state: The conversation's dialogue state, or None for a new conversation.
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
        machine = DialogueStateMachine.restore(state) if state is not None else DialogueStateMachine()
        previous = PreviousTurn(previous_text, machine.intent) if previous_text and machine.intent else None
        if machine.offered is not None and machine.state not in _ASKING:
            if _OFFER_TAKEN.match(text):  # "yes": the request that waited is this turn's
                text, embedding, previous = machine.offered, None, None
            elif _OFFER_REFUSED.match(text):
                machine.apply(DialogueEvent(EventType.RESET, event_id=turn_id))
                return self._decide(machine, OFFER_REFUSED_REPLY)
        reading = self._read(machine, text, turn_id, embedding, previous)
        machine.apply(reading.event)
        response = self._fixed_response(machine, turn_id)
        if reading.event.type == EventType.OUT_OF_SCOPE and machine.state == State.IDLE:
            response = self.bot.fallback  # no intent fits and no flow is asking: the bot's own answer, if it has one
        if reading.event.type in (EventType.DENIED, EventType.RESET):
            response = reading.reply or CANCELLED_REPLY
        said = response if response is not None else self._question(machine, self.bot.flow(machine.intent or OUT_OF_SCOPE))
        said = _joined(reading.preface, said)  # a question answered mid-flow, or why a value was refused; then the flow asks on
        if reading.also is not None:  # the second request's answer: before the first's question, else after its reply
            said = _joined(reading.also, said) if machine.state in _ASKING else _joined(said, reading.also)
        if machine.waiting is not None and machine.state not in _ASKING:
            offer = OFFER.format(request=self._described(machine.waiting))
            machine.apply(DialogueEvent(EventType.OFFERED, event_id=f"{turn_id}:offered" if turn_id else None))
            said = _joined(said, offer)
        return self._decide(machine, said)

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

    def _read(
        self,
        machine: DialogueStateMachine,
        text: str,
        turn_id: str | None,
        embedding: np.ndarray | None,
        previous: PreviousTurn | None,
    ) -> _Reading:
        """The turn's one event, and what the bot says besides the flow's own words."""
        if machine.state in _ASKING and machine.intent is not None:
            return self._read_in_flow(machine, text, turn_id, embedding)
        if (declined := self._declined(text)) is not None:
            return _Reading(DialogueEvent(EventType.RESET, {"declined": declined.intent}, turn_id), reply=DECLINED_REPLY)
        if (two := self._two_requests(text, turn_id)) is not None:
            return two
        result = read_in_context(self.classifier, text, previous, embedding)
        if result.intent == OUT_OF_SCOPE:
            return _Reading(DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text, "confidence": result.confidence}, turn_id))
        return self._detected(result.intent, result.confidence, text, turn_id)

    def _read_in_flow(self, machine: DialogueStateMachine, text: str, turn_id: str | None, embedding: np.ndarray | None) -> _Reading:
        """A turn while a flow asks: a value (or a refused one), yes or no, a call-off, a
        question answered on the side (a digression: the flow stays where it is), another request."""
        assert machine.intent is not None
        # A changed value first: "no, make it 300" corrects the amount, it does not call the transfer off.
        found, refusal = self._extractor.checked(self._extractor.extract(text, self.bot.intent(machine.intent).slots))
        changed = {k: v for k, v in found.items() if machine.slots.get(k) != v}
        if changed:
            return _Reading(DialogueEvent(EventType.SLOT_FILLED, {"slots": changed}, turn_id), preface=refusal)
        if refusal is not None:
            return _Reading(DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), preface=refusal)
        if machine.state == State.CONFIRMING:
            # "no" is checked first: "no, don't do it" contains "do it".
            if _NO.search(text):
                return _Reading(DialogueEvent(EventType.DENIED, event_id=turn_id))
            if _YES.search(text):
                return _Reading(DialogueEvent(EventType.CONFIRMED, event_id=turn_id))
        if _CANCEL.search(text):
            return _Reading(DialogueEvent(EventType.RESET, event_id=turn_id))
        if (declined := self._declined(text)) is not None:
            # Of this flow, or not surely of another ("I don't want to send money anymore" mid-transfer
            # may read as cancelling one): called off. Surely of another: nothing starts, the flow goes on.
            if declined.intent == machine.intent or declined.confidence <= self.promote_threshold:
                return _Reading(DialogueEvent(EventType.RESET, {"declined": declined.intent}, turn_id))
            return _Reading(DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), preface=DECLINED)
        result = self.classifier.classify(text, embedding)
        other = self.bot.intent(result.intent) if result.intent not in (OUT_OF_SCOPE, machine.intent) else None
        if other is not None and other.answer is not None:
            return _Reading(DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), preface=other.answer)
        if other is not None:
            return self._detected(result.intent, result.confidence, text, turn_id)
        wanted = self._extractor.kind(machine.missing_slots[0]) if machine.missing_slots else None
        return _Reading(DialogueEvent(EventType.OUT_OF_SCOPE, {"text": text}, turn_id), preface=NOT_A_NUMBER if wanted == "amount" else None)

    def _declined(self, text: str) -> IntentResult | None:
        """The reading of what `text` declines (`dialog.requests.declined`), if the bot would act
        on it: declining what the bot only answers ("I don't want to pay fees") is no decline to heed."""
        request = declined(text)
        if request is None:
            return None
        reading = self.classifier.classify(request)
        flow = self.bot.flow(reading.intent) if reading.intent != OUT_OF_SCOPE else None
        return reading if flow is not None and (flow.action is not None or flow.hand_off) else None

    def _two_requests(self, text: str, turn_id: str | None) -> _Reading | None:
        """The first request's reading, with the second's answer (`also`) or the second waiting
        its turn, when `text` holds two requests the bot handles (`dialog.requests.two_requests`)."""
        for first, second in two_requests(text):
            one, two = self.classifier.classify(first), self.classifier.classify(second)
            if one.intent == two.intent or not (self._handles(one.intent) and self._handles(two.intent)):
                continue
            reading = self._detected(one.intent, one.confidence, first, turn_id)
            answer = self._fixed_answer(two.intent)
            if answer is not None:
                return replace(reading, also=answer)
            waiting = DialogueEvent(reading.event.type, {**reading.event.payload, "waiting": second}, turn_id)
            return replace(reading, event=waiting)
        return None

    def _handles(self, intent: str) -> bool:
        """The bot itself carries `intent` out (a flow, a curated answer), without a person or the model."""
        if intent == OUT_OF_SCOPE or self.bot.flow(intent).hand_off:
            return False
        flow = self.bot.flow(intent)
        return flow.action is not None or flow.response is not None or self.bot.intent(intent).answer is not None

    def _fixed_answer(self, intent: str) -> str | None:
        """What the bot says to `intent` at once, with nothing to ask or do: its curated answer."""
        flow = self.bot.flow(intent)
        if flow.action is not None or flow.confirm is not None or self.bot.intent(intent).slots:
            return None
        return flow.response or self.bot.intent(intent).answer

    def _described(self, request: str) -> str:
        intent = self.classifier.classify(request).intent
        if intent == OUT_OF_SCOPE:
            return f'"{request}"'
        return self.bot.intent(intent).description or intent.replace("_", " ")

    def _detected(self, intent: str, confidence: float, text: str, turn_id: str | None) -> _Reading:
        flow = self.bot.flow(intent)
        if flow.hand_off:
            return _Reading(DialogueEvent(EventType.HAND_OFF, {"intent": intent, "confidence": confidence}, turn_id))
        names = self.bot.intent(intent).slots
        found, refusal = self._extractor.checked(self._extractor.extract(text, names))
        payload = {
            "intent": intent,
            "confidence": confidence,
            "slots": {**self._extractor.defaults(names), **found},
            "required": names,
            "confirm": flow.confirm is not None,
        }
        return _Reading(DialogueEvent(EventType.INTENT_DETECTED, payload, turn_id), preface=refusal)

    def _decide(self, machine: DialogueStateMachine, response: str | None) -> TurnDecision:
        intent = machine.intent if machine.intent is not None else OUT_OF_SCOPE
        flow = self.bot.flow(intent) if intent != OUT_OF_SCOPE else None
        return TurnDecision(
            state=machine.snapshot(),
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

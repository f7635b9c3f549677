"""One turn at a time through the shipped bot's flows, on the toy embedder."""

from __future__ import annotations

import pytest

from chatcache.dialog import OUT_OF_SCOPE, DialogueManager, IllegalTransitionError, IntentClassifier
from chatcache.dialog.manager import NOT_A_NUMBER


@pytest.fixture()
def manager(bot, embed) -> DialogueManager:
    return DialogueManager(bot, IntentClassifier(bot, embed))


def test_flow_asks_each_missing_slot_then_confirms_then_acts(bot, embed) -> None:
    # promote_threshold=1: only the user's "yes" may confirm here, not the classifier.
    manager = DialogueManager(bot, IntentClassifier(bot, embed), promote_threshold=1.0)
    first = manager.handle(None, "I want to transfer money")
    assert (first.intent, first.state.state) == ("transfer_money", "COLLECTING_SLOTS")
    assert first.prompt == "How much would you like to transfer?"
    assert first.state.flow_active and first.action is None

    second = manager.handle(first.state, "250 dollars")
    assert second.state.slots == {"amount": "250"}
    assert second.prompt == "What is the 8-digit number of the account it should go to?"

    third = manager.handle(second.state, "it's 12345674")
    assert third.state.state == "CONFIRMING"
    assert third.prompt == "Shall I transfer 250 to account 12345674?"
    assert not third.confirmed

    fourth = manager.handle(third.state, "yes please")
    assert fourth.confirmed and fourth.action == "transfer_money"
    assert fourth.state.state == "ACTING" and fourth.prompt is None


def test_slots_given_up_front_are_not_asked_for(manager) -> None:
    decision = manager.handle(None, "transfer 40 to account 87654323")
    assert decision.state.slots == {"amount": "40", "to_account": "87654323"}
    assert decision.state.state == "CONFIRMING"


def test_no_at_confirmation_cancels(manager) -> None:
    asked = manager.handle(None, "I lost my debit card")
    assert asked.prompt == "Shall I block your debit card now?"
    cancelled = manager.handle(asked.state, "no, don't do it")
    assert cancelled.state.state == "IDLE" and cancelled.intent == OUT_OF_SCOPE


def test_unclear_reply_mid_flow_reasks_the_question_saying_an_amount_is_a_number(manager) -> None:
    asked = manager.handle(None, "I want to transfer money")
    again = manager.handle(asked.state, "hmm, let me think")
    assert again.state.state == "COLLECTING_SLOTS"
    assert again.prompt == f"{NOT_A_NUMBER}\n\n{asked.prompt}" and again.intent == "transfer_money"


def test_cacheable_intent_without_flow_acts_at_once(manager) -> None:
    decision = manager.handle(None, "What are your opening hours?")
    assert decision.intent == "opening_hours" and decision.cacheable
    assert decision.state.state == "ACTING" and decision.action is None
    assert not manager.handle(None, "Check my balance please").cacheable


def test_high_confidence_promotes_to_confirmed(bot, embed) -> None:
    classifier = IntentClassifier(bot, embed)
    text = "What are your opening hours?"
    confidence = classifier.classify(text).confidence
    assert DialogueManager(bot, classifier, promote_threshold=confidence - 0.01).handle(None, text).confirmed
    assert not DialogueManager(bot, classifier, promote_threshold=min(confidence + 0.001, 1.0)).handle(
        None, text
    ).confirmed


def test_hand_off_and_then_no_more_bot_turns(manager) -> None:
    handed = manager.handle(None, "I want to talk to a human")
    assert handed.state.state == "HANDED_OFF" and handed.intent == "talk_to_human"
    with pytest.raises(IllegalTransitionError, match="HANDED_OFF"):
        manager.handle(handed.state, "check my balance please")


def test_retried_turn_is_a_no_op(manager) -> None:
    first = manager.handle(None, "I want to transfer money", turn_id="m1")
    again = manager.handle(first.state, "I want to transfer money", turn_id="m1")
    assert again.state == first.state


def test_out_of_scope_turn(manager) -> None:
    decision = manager.handle(None, "quantum chromodynamics lecture")
    assert decision.intent == OUT_OF_SCOPE and decision.prompt is None and not decision.cacheable
    assert decision.state.state == "IDLE" and decision.state.version == 1




def test_a_flow_without_an_action_gives_its_fixed_response_and_is_done(write_shop_bot, embed) -> None:  # type: ignore[no-untyped-def]
    from chatcache.dialog import load_bot

    bot = load_bot(write_shop_bot())
    manager = DialogueManager(bot, IntentClassifier(bot, embed))
    hours = manager.handle(None, "When are you open?")
    assert hours.prompt == "We are open from 9 to 5 on weekdays."
    assert hours.state.state == "DONE" and hours.action is None
    asked = manager.handle(hours.state, "Where is my order?")
    assert asked.prompt == "What is your 6-digit order number?"
    answered = manager.handle(asked.state, "it is 123456")
    assert answered.prompt == "Order 123456 ships within two days." and answered.state.state == "DONE"
    again = manager.handle(answered.state, "When are you open?", turn_id="t9")
    assert again.prompt == hours.prompt  # a done flow starts over on the next request


def test_a_fixed_response_cannot_name_an_action_result(write_shop_bot) -> None:  # type: ignore[no-untyped-def]
    from chatcache.dialog import BotDefinitionError, load_bot

    path = write_shop_bot(replace=("We are open from 9 to 5 on weekdays.", "Open {result.hours}."))
    with pytest.raises(BotDefinitionError, match="placeholder '{result}' is not a slot of 'opening_hours'"):
        load_bot(path)


def test_a_message_no_intent_fits_gets_the_bots_fallback_outside_a_flow_only(write_shop_bot, embed) -> None:  # type: ignore[no-untyped-def]
    from chatcache.dialog import load_bot

    bot = load_bot(write_shop_bot(extra="fallback: I can help with opening hours and orders. Would you like a person instead?\n"))
    manager = DialogueManager(bot, IntentClassifier(bot, embed))
    stray = manager.handle(None, "Tell me a joke about penguins")
    assert stray.intent == OUT_OF_SCOPE and stray.prompt == "I can help with opening hours and orders. Would you like a person instead?"
    asked = manager.handle(None, "Where is my order?")
    still = manager.handle(asked.state, "Tell me a joke about penguins")  # mid-flow: the flow asks again
    assert still.prompt == "What is your 6-digit order number?"
    plain = load_bot(write_shop_bot())  # without a fallback the model answers it
    assert DialogueManager(plain, IntentClassifier(plain, embed)).handle(None, "Tell me a joke about penguins").prompt is None

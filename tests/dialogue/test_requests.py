"""A message's shape before its intent (`dialog.requests`): a decline starts nothing, and a
message with two requests gets both, on a small bank bot and the toy embedder.

Precision first: every rule is tested on what it must not match as much as on what it must."""

from __future__ import annotations

from typing import Any

import pytest

from chatcache.dialog import OUT_OF_SCOPE, BotDefinition, DialogueEvent, DialogueManager, DialogueState, DialogueStateMachine, EventType, IntentClassifier
from chatcache.dialog.manager import DECLINED_REPLY, OFFER_REFUSED_REPLY
from chatcache.dialog.requests import declined, two_requests


@pytest.mark.parametrize(
    ("text", "declines"),
    [
        ("I don't want to block my card", "block my card"),
        ("I really don't want to block my card.", "block my card"),
        ("No, I don't want you to send it", "send it"),
        ("we do not wish to close the account!", "close the account"),
        ("no need to send the money", "send the money"),
        ("There is no need for you to block my card.", "block my card"),
        ("I'd rather not block my card", "block my card"),
        ("I would rather not transfer money", "transfer money"),
        ("I don’t want to block my card", "block my card"),  # a phone's typographic apostrophe
        ("I don't want to send money anymore", "send money"),  # what no longer holds is no part of the request
        ("I don't want to send money any more.", "send money"),
        ("I do not want to transfer it after all", "transfer it"),
    ],
)
def test_a_plain_decline_names_the_request_it_declines(text: str, declines: str) -> None:
    assert declined(text) == declines


@pytest.mark.parametrize(
    "text",
    [
        "I want to block my card, I don't want it used",  # a request that says what it does not want
        "My credit card was stolen, I don't want it used",
        "I don't want to block it but to order a new one",
        "I don't want to block it, just freeze it",
        "I don't want to block it, instead freeze it",
        "I don't want to block it, only freeze it",
        "I'd rather not block it but freeze it",
        "I don't want to block my card. Can you freeze it?",  # a second sentence asks for something
        "why don't I want to block my card",
        "I don't want my card blocked",  # no declining phrase at the start of a clause the rule knows
        "block my card",
        "I want to block my card",
    ],
)
def test_what_is_no_plain_decline_is_not_read_as_one(text: str) -> None:
    assert declined(text) is None


@pytest.mark.parametrize(
    ("text", "halves"),
    [
        ("what's my balance and can you also tell me your opening hours", ("what's my balance", "tell me your opening hours")),
        ("What are your opening hours? What's my balance?", ("What are your opening hours", "What's my balance?")),
        ("what's my balance and I lost my card", ("what's my balance", "I lost my card")),
        ("what's my balance, and block my card", ("what's my balance", "block my card")),
        ("what's my balance and please block my card", ("what's my balance", "block my card")),
        ("check my balance, also when are you open", ("check my balance", "when are you open")),
        ("my balance please; and your opening hours", ("my balance please", "your opening hours")),
    ],
)
def test_two_requests_are_split_at_a_sentence_end_or_an_and_between_clauses(text: str, halves: tuple[str, str]) -> None:
    assert two_requests(text)[0] == halves


@pytest.mark.parametrize(
    "text",
    [
        "Please send me the terms and conditions",
        "what are the terms and conditions",
        "Apple Pay and Google Pay",  # two names, one request (`MIN_WORDS`)
        "Can I add Apple Pay and Google Pay",
        "send 50 to my mum and dad",
        "I want to read the terms and conditions of my account",
        "What are the fees and charges for transfers abroad?",
        "block my card.",
        "I want to transfer money",
    ],
)
def test_one_request_with_and_inside_it_is_not_split(text: str) -> None:
    assert two_requests(text) == []


# Through the manager: what the rules find is heeded only when the bot would act on it.


@pytest.fixture
def manager(small_bank: BotDefinition, embed: Any) -> DialogueManager:
    return DialogueManager(small_bank, IntentClassifier(small_bank, embed))


def acted(state: DialogueState) -> DialogueState:
    """The state once the caller performed the decision's action (as the engine does)."""
    machine = DialogueStateMachine.restore(state)
    machine.apply(DialogueEvent(EventType.ACTED, event_id="acted"))
    return machine.snapshot()


def test_declining_what_the_bot_does_starts_nothing(manager: DialogueManager) -> None:
    assert manager.classifier.classify("I don't want to block my card").intent == "block_card"  # read for its intent, it would start
    for text in ("I don't want to block my card", "I'd rather not block my card"):
        decision = manager.handle(None, text)
        assert decision.prompt == DECLINED_REPLY
        assert decision.state.state == "IDLE" and decision.intent == OUT_OF_SCOPE and decision.action is None


def test_declining_what_the_bot_only_answers_is_no_decline_to_heed(manager: DialogueManager) -> None:
    # "pay fees" reads as the fees question, which the bot answers and never acts on.
    assert declined("I don't want to pay fees") == "pay fees" and manager.classifier.classify("pay fees").intent == "fees"
    decision = manager.handle(None, "I don't want to pay fees")
    assert decision.prompt != DECLINED_REPLY


def test_declining_another_request_mid_flow_keeps_the_flow(manager: DialogueManager) -> None:
    asked = manager.handle(None, "I want to send money")
    decision = manager.handle(asked.state, "I don't want to block my card")
    assert decision.state.state == "COLLECTING_SLOTS" and decision.intent == "transfer_money"
    assert decision.prompt == "All right, I will not do that.\n\nHow much would you like to send?"


def test_a_decline_mid_flow_not_surely_of_another_request_calls_the_flow_off(manager: DialogueManager) -> None:
    asked = manager.handle(None, "I want to send money")
    unsure = manager.classifier.classify("block my card")
    assert unsure.intent == "block_card" and unsure.confidence <= 1.0
    strict = DialogueManager(manager.bot, manager.classifier, promote_threshold=1.0)  # no reading is sure enough
    decision = strict.handle(asked.state, "I don't want to block my card")
    assert decision.state.state == "IDLE" and decision.intent == OUT_OF_SCOPE and decision.action is None


def test_two_answers_in_one_message_are_both_given(manager: DialogueManager) -> None:
    decision = manager.handle(None, "when are you open and what are your fees")
    assert decision.prompt == "We are open from 9 to 5.\n\nTransfers within the country are free."


def test_a_second_request_that_acts_is_offered_once_the_first_is_done_and_yes_takes_it(manager: DialogueManager) -> None:
    first = manager.handle(None, "what's my balance and please block my card now")
    assert first.intent == "check_balance" and first.action == "balance"
    assert first.prompt == "You also asked about blocking your card: shall I go on with that?"
    assert first.state.offered == "block my card now" and first.state.waiting is None
    taken = manager.handle(acted(first.state), "yes please")
    assert taken.intent == "block_card" and taken.prompt == "Shall I block your card now?"
    assert taken.state.offered is None  # offered once: answered


def test_no_thanks_to_the_offer_closes_it(manager: DialogueManager) -> None:
    first = manager.handle(None, "what's my balance and please block my card now")
    refused = manager.handle(acted(first.state), "no thanks")
    assert refused.prompt == OFFER_REFUSED_REPLY and refused.intent == OUT_OF_SCOPE and refused.action is None
    assert refused.state.offered is None and refused.state.state == "IDLE"
    later = manager.handle(refused.state, "yes")  # nothing is on offer any more
    assert later.intent == OUT_OF_SCOPE


def test_an_answer_first_then_the_second_request_offered(manager: DialogueManager) -> None:
    first = manager.handle(None, "What are your opening hours? What's my balance?")
    assert first.prompt == "We are open from 9 to 5.\n\nYou also asked about the balance of your account: shall I go on with that?"
    taken = manager.handle(first.state, "yes")
    assert taken.intent == "check_balance" and taken.action == "balance"


def test_another_request_instead_of_an_answer_to_the_offer_drops_it(manager: DialogueManager) -> None:
    first = manager.handle(None, "What are your opening hours? What's my balance?")
    other = manager.handle(first.state, "what are your fees")
    assert other.prompt == "Transfers within the country are free." and other.state.offered is None
    assert manager.handle(other.state, "yes").intent == OUT_OF_SCOPE


def test_the_same_intent_twice_is_one_request(manager: DialogueManager) -> None:
    decision = manager.handle(None, "what's my balance and show me my balance")
    assert decision.intent == "check_balance" and decision.state.waiting is None and decision.state.offered is None


def test_a_one_clause_request_with_and_in_a_noun_phrase_gets_one_answer(small_bank: BotDefinition, embed: Any, tmp_path: Any) -> None:
    """"conditions of my account" alone reads as the balance (the toy embedder's "my account"), so
    a split at every "and" would answer the terms and then offer the balance nobody asked for."""
    from chatcache.dialog import load_bot

    terms = "  - name: terms\n    examples: ['where are the terms and conditions', 'I want to read the terms']\n    answer: Our terms are at bank.example/terms.\nslots:\n"
    path = tmp_path / "terms_bank.yaml"
    text = (tmp_path / "small_bank.yaml").read_text().replace("slots:\n  - name: to_account", terms + "  - name: to_account", 1)
    path.write_text(text.replace("'show me my balance']", "'show me my balance', 'the balance of my account']"))
    bot = load_bot(path)
    manager = DialogueManager(bot, IntentClassifier(bot, embed))
    assert manager.classifier.classify("conditions of my account").intent == "check_balance"
    decision = manager.handle(None, "I want to read the terms and conditions of my account")
    assert decision.prompt == "Our terms are at bank.example/terms."
    assert decision.state.waiting is None and decision.state.offered is None

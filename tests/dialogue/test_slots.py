"""Slot extraction: patterns, value lists and amounts (the shipped bot's rules); currencies,
refused values and defaults (a small bank bot that sends euros only)."""

from __future__ import annotations

from typing import Any

import pytest

from chatcache.dialog import BotDefinition, DialogueManager, IntentClassifier, SlotExtractor
from chatcache.dialog.manager import NOT_A_NUMBER
from chatcache.dialog.slots import NOT_ABOVE_ZERO


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Send 200 dollars to account 12345674", {"amount": "200", "to_account": "12345674"}),
        ("wire $1,250.5 to 87654323 please", {"amount": "1250.50", "to_account": "87654323"}),
        ("12345674", {"to_account": "12345674"}),
        ("75", {"amount": "75"}),
        ("€30.25", {"amount": "30.25"}),
        ("I want to transfer money", {}),
    ],
)
def test_transfer_slots(bot, text: str, expected: dict[str, str]) -> None:
    assert SlotExtractor(bot).extract(text, ["amount", "to_account"]) == expected


def test_value_list_is_case_insensitive_whole_word_and_canonical(bot) -> None:
    extractor = SlotExtractor(bot)
    assert extractor.extract("my CREDIT card is gone", ["card_type"]) == {"card_type": "credit"}
    assert extractor.extract("incredible", ["card_type"]) == {}
    assert extractor.extract("debit, not credit", ["card_type"]) == {"card_type": "debit"}


def test_only_the_named_slots_are_extracted(bot) -> None:
    assert SlotExtractor(bot).extract("200 to 12345674 on my debit card", ["card_type"]) == {"card_type": "debit"}
    assert SlotExtractor(bot).extract("200 on my debit card") == {"amount": "200", "card_type": "debit"}


# The currency kind, signs kept, refusals and defaults, on the small bank bot (euros only).


@pytest.mark.parametrize(
    ("text", "currency"),
    [
        ("$50", "USD"),
        ("50 dollars", "USD"),
        ("50 US dollars", "USD"),
        ("fifty bucks", "USD"),
        ("£20", "GBP"),
        ("20 pounds", "GBP"),
        ("20 quid", "GBP"),
        ("EUR 30", "EUR"),
        ("30 euros", "EUR"),
        ("€30", "EUR"),
        ("100 chf", "CHF"),
        ("5000 yen", "JPY"),
        ("send 50 to account 12345674", None),
    ],
)
def test_a_currency_is_read_from_its_sign_word_or_code(small_bank: BotDefinition, text: str, currency: str | None) -> None:
    found = SlotExtractor(small_bank).extract(text, ["currency"])
    assert found.get("currency") == currency


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("-50", "-50"),
        ("minus 50", "-50"),
        ("$-50", "-50"),
        ("-€50", "-50"),
        ("send 1,000 euros", "1000"),
        ("send 50.", "50"),
        ("€ 12.5", "12.50"),
        ("send 1.000 euros", None),  # 1 or 1000: not guessed
        ("12.345", None),
        ("fifty", None),
    ],
)
def test_an_amount_keeps_its_minus_sign_and_is_not_guessed(small_bank: BotDefinition, text: str, amount: str | None) -> None:
    assert SlotExtractor(small_bank).extract(text, ["amount"]).get("amount") == amount


def test_zero_or_less_is_refused_and_a_currency_not_valid_takes_the_amount_with_it(small_bank: BotDefinition) -> None:
    extractor = SlotExtractor(small_bank)
    assert extractor.checked({"amount": "0"}) == ({}, NOT_ABOVE_ZERO.format(value="0"))
    assert extractor.checked({"amount": "-50.00"}) == ({}, "An amount has to be more than zero, and -50.00 is not.")
    assert extractor.checked({"amount": "0.01", "currency": "EUR"}) == ({"amount": "0.01", "currency": "EUR"}, None)
    assert extractor.checked({"amount": "50", "currency": "USD", "to_account": "12345674"}) == (
        {"to_account": "12345674"},
        "We send euros only, not USD.",
    )
    assert extractor.checked({"to_account": "99999999"}) == ({}, "99999999 is a closed account; give another one.")


@pytest.fixture
def manager(small_bank: BotDefinition, embed: Any) -> DialogueManager:
    return DialogueManager(small_bank, IntentClassifier(small_bank, embed))


def test_a_default_fills_its_slot_and_is_never_asked(manager: DialogueManager) -> None:
    asked = manager.handle(None, "I want to send money")
    assert asked.state.slots == {"currency": "EUR"} and asked.prompt == "How much would you like to send?"
    account = manager.handle(asked.state, "50")
    assert account.prompt == "To which account?"
    confirm = manager.handle(account.state, "12345674")
    assert confirm.prompt == "Send 50 EUR to 12345674?"


def test_a_currency_said_overrides_the_default(manager: DialogueManager) -> None:
    decision = manager.handle(None, "send 50 euros to account 12345674")
    assert decision.state.slots == {"currency": "EUR", "amount": "50", "to_account": "12345674"}


def test_a_refused_value_says_why_and_the_flow_asks_again(manager: DialogueManager) -> None:
    dollars = manager.handle(None, "send 50 dollars to account 12345674")
    assert dollars.prompt == "We send euros only, not USD.\n\nHow much would you like to send?"
    assert "amount" not in dollars.state.slots and dollars.state.slots["currency"] == "EUR"  # never sent as 50 EUR
    negative = manager.handle(None, "send -50 to account 12345674")
    assert negative.prompt == "An amount has to be more than zero, and -50 is not.\n\nHow much would you like to send?"
    closed = manager.handle(None, "send 50 to account 99999999")
    assert closed.prompt == "99999999 is a closed account; give another one.\n\nTo which account?"
    assert closed.state.state == "COLLECTING_SLOTS" and "to_account" not in closed.state.slots


def test_mid_flow_a_refused_value_is_refused_and_a_good_one_taken(manager: DialogueManager) -> None:
    asked = manager.handle(None, "I want to send money")
    zero = manager.handle(asked.state, "0")
    assert zero.prompt == "An amount has to be more than zero, and 0 is not.\n\nHow much would you like to send?"
    pounds = manager.handle(zero.state, "£20")
    assert pounds.prompt == "We send euros only, not GBP.\n\nHow much would you like to send?" and "amount" not in pounds.state.slots
    good = manager.handle(pounds.state, "20")
    assert good.state.slots["amount"] == "20" and good.prompt == "To which account?"


def test_an_amount_answer_without_figures_is_told_how_to_give_it(manager: DialogueManager) -> None:
    asked = manager.handle(None, "I want to send money")
    words = manager.handle(asked.state, "fifty")
    assert words.prompt == f"{NOT_A_NUMBER}\n\nHow much would you like to send?" and words.state.state == "COLLECTING_SLOTS"
    account = manager.handle(manager.handle(asked.state, "50").state, "no idea")
    assert account.prompt == "To which account?"  # an account is no amount: no word about figures


def test_valid_without_invalid_is_a_bot_file_error(small_bank: BotDefinition, tmp_path: Any) -> None:
    from chatcache.dialog import BotDefinitionError, load_bot

    path = tmp_path / "small_bank.yaml"
    path.write_text(path.read_text().replace("    invalid: '{value} is a closed account; give another one.'\n", ""))
    with pytest.raises(BotDefinitionError, match="a slot with `valid` needs `invalid`"):
        load_bot(path)
    path.write_text(path.read_text().replace("    invalid: We send euros only, not {value}.", "    invalid: Not {currency}."))
    with pytest.raises(BotDefinitionError, match=r"the only placeholder is \{value\}"):
        load_bot(path)

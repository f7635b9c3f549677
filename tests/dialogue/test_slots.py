"""Slot extraction from the shipped bot's rules: patterns, value lists and amounts."""

from __future__ import annotations

import pytest

from dialog import SlotExtractor


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Send 200 dollars to account 12345678", {"amount": "200", "to_account": "12345678"}),
        ("wire $1,250.5 to 87654321 please", {"amount": "1250.50", "to_account": "87654321"}),
        ("12345678", {"to_account": "12345678"}),
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
    assert SlotExtractor(bot).extract("200 to 12345678 on my debit card", ["card_type"]) == {"card_type": "debit"}
    assert SlotExtractor(bot).extract("200 on my debit card") == {"amount": "200", "card_type": "debit"}

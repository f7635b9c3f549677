"""Pull slot values out of a user's text with the rules the bot file gives, and check them.

Values are plain strings so that they sit unchanged in the serialisable dialogue state. The
extractor does not guess: a slot without a match is simply absent from the result, and the
flow asks for it. Nor does it change what the user said: "-50" is the amount -50 (refused,
never sent as 50), "50 dollars" is 50 in the currency USD, and a bot that sends euros only
refuses the dollars (`Slot.valid`) instead of reading them as euros. What it does not do:
convert currencies, or read numbers written in words ("fifty").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

from .definition import BotDefinition, Slot

# Optional minus, optional currency sign, digits with optional thousands commas, optional cents,
# optional unit (the currency slot reads the sign or unit first, when the intent has one). No
# digit, comma or ".digit" may follow: "1.000" (a thousand where a dot groups thousands) and
# "12.345" are not read at all, rather than as 1 and 12.
_AMOUNT = re.compile(
    r"(?<![\w.,])(-|minus\s)?\s?[$€£]?\s?(-)?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?![\d,]|\.\d)"
    r"(?:\s?(?:dollars?|usd|euros?|eur|pounds?|gbp|bucks))?\b",
    re.IGNORECASE,
)
# ISO code -> how customers write it, besides the code itself. "pound" or "franc" in another
# sense is rare in a money request, and a wrong read is refused or confirmed, never acted on.
_CURRENCY_WORDS = {
    "EUR": "euros?",
    "USD": "(?:us )?dollars?|bucks",
    "GBP": "pounds?(?: sterling)?|sterling|quid",
    "CHF": "(?:swiss )?francs?",
    "JPY": "yen",
}
_CURRENCY_SIGNS = {"€": "EUR", "$": "USD", "£": "GBP", "¥": "JPY"}
_CURRENCY_CODES = ["EUR", "USD", "GBP", "CHF", "JPY", "SEK", "NOK", "DKK", "PLN", "CZK", "HUF", "CAD", "AUD", "CNY", "INR"]
_CURRENCY = re.compile(
    "|".join(
        [rf"\b(?P<{code}>{words})\b" for code, words in _CURRENCY_WORDS.items()]
        + [rf"(?P<sign>[{''.join(_CURRENCY_SIGNS)}])", rf"\b(?P<code>{'|'.join(_CURRENCY_CODES)})\b"]
    ),
    re.IGNORECASE,
)
NOT_ABOVE_ZERO = "An amount has to be more than zero, and {value} is not."
"""Why an amount of zero or less is refused, unless its slot says it in `invalid`."""


class SlotExtractor:
    """Extracts the slots of a bot from free text.

    Pattern, value-list and currency slots run first and claim the span they match; amounts are
    looked for in what is left. Why: an account number is also a number, and the more specific
    rule should win rather than whichever slot happens to come first.
    """

    def __init__(self, bot: BotDefinition) -> None:
        self._slots = {slot.name: slot for slot in bot.slots}

    def extract(self, text: str, names: Iterable[str] | None = None) -> dict[str, str]:
        """Find values for the named slots in `text`.

        Args:
            text: The user's utterance.
            names: Slots to look for (those of the current intent); all of the bot's if None.

        Returns:
            slot name -> value, for the slots that were found.
        """
        wanted = [self._slots[name] for name in (names if names is not None else self._slots)]
        found: dict[str, str] = {}
        remaining = text
        for slot in sorted(wanted, key=lambda s: s.kind == "amount"):  # stable: the others keep their order
            match = _match(slot, remaining)
            if match is not None:
                value, (start, end) = match
                found[slot.name] = value
                remaining = remaining[:start] + " " * (end - start) + remaining[end:]
        return found

    def kind(self, name: str) -> str:
        """The kind of the slot `name` ("text", "amount", "currency")."""
        return self._slots[name].kind

    def defaults(self, names: Iterable[str]) -> dict[str, str]:
        """The default values of the named slots that have one (a currency not said)."""
        return {name: default for name in names if (default := self._slots[name].default) is not None}

    def checked(self, found: dict[str, str]) -> tuple[dict[str, str], str | None]:
        """The values of `found` the bot accepts, and why the first refused one is refused.

        A refused currency takes the amount said with it along: kept alone, "50" would be read
        in the default currency, the silent change the refusal is there to prevent.
        """
        refused = {name: reason for name, value in found.items() if (reason := self._refusal(self._slots[name], value)) is not None}
        if not refused:
            return found, None
        if any(self._slots[name].kind == "currency" for name in refused):
            refused |= {name: "" for name in found if self._slots[name].kind == "amount"}
        kept = {name: value for name, value in found.items() if name not in refused}
        return kept, next(reason for reason in refused.values() if reason)

    @staticmethod
    def _refusal(slot: Slot, value: str) -> str | None:
        if slot.kind == "amount" and Decimal(value) <= 0:
            return (slot.invalid or NOT_ABOVE_ZERO).format(value=value)
        if slot.valid is not None and slot.invalid is not None and not re.fullmatch(slot.valid, value, re.IGNORECASE):
            return slot.invalid.format(value=value)
        return None


def _match(slot: Slot, text: str) -> tuple[str, tuple[int, int]] | None:
    if slot.kind == "amount":
        return _amount(text)
    if slot.kind == "currency":
        return _currency(text)
    if slot.pattern is not None:
        match = re.search(slot.pattern, text, re.IGNORECASE)
        if match is None:
            return None
        value = next((group for group in match.groups() if group), match.group(0))
        return value, match.span()
    hits = []
    for value in slot.values or []:
        hit = re.search(rf"\b{re.escape(value)}\b", text, re.IGNORECASE)
        if hit is not None:
            hits.append((hit.start(), value, hit.span()))
    if not hits:
        return None
    _, value, span = min(hits)  # the value mentioned first
    return value, span


def _amount(text: str) -> tuple[str, tuple[int, int]] | None:
    match = _AMOUNT.search(text)
    if match is None:
        return None
    negative = match.group(1) or match.group(2)
    whole = match.group(3).replace(",", "")
    cents = match.group(4)
    value = f"{int(whole)}.{cents.ljust(2, '0')}" if cents else str(int(whole))
    return f"-{value}" if negative else value, match.span()


def _currency(text: str) -> tuple[str, tuple[int, int]] | None:
    match = _CURRENCY.search(text)
    if match is None:
        return None
    group = match.lastgroup
    assert group is not None
    said = match.group(group)
    code = _CURRENCY_SIGNS[said] if group == "sign" else said.upper() if group == "code" else group
    return code, match.span()

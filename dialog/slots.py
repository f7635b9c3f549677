"""Pull slot values out of a user's text with the rules the bot file gives.

Values are plain strings so that they sit unchanged in the serialisable dialogue state. The
extractor does not guess: a slot without a match is simply absent from the result, and the
flow asks for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .definition import BotDefinition, Slot

# Optional currency sign, digits with optional thousands commas, optional cents, optional unit.
_AMOUNT = re.compile(
    r"(?<![\w.,])[$€£]?\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?![\d,])"
    r"(?:\s?(?:dollars?|usd|euros?|eur|pounds?|gbp|bucks))?\b",
    re.IGNORECASE,
)


class SlotExtractor:
    """Extracts the slots of a bot from free text.

    Pattern and value-list slots run first and claim the span they match; amounts are looked
    for in what is left. Why: an account number is also a number, and the more specific rule
    should win rather than whichever slot happens to come first.
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
        for slot in sorted(wanted, key=lambda s: s.kind == "amount"):
            match = _match(slot, remaining)
            if match is not None:
                value, (start, end) = match
                found[slot.name] = value
                remaining = remaining[:start] + " " * (end - start) + remaining[end:]
        return found


def _match(slot: Slot, text: str) -> tuple[str, tuple[int, int]] | None:
    if slot.kind == "amount":
        return _amount(text)
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
    whole = match.group(1).replace(",", "")
    cents = match.group(2)
    value = f"{int(whole)}.{cents.ljust(2, '0')}" if cents else str(int(whole))
    return value, match.span()

"""Whether a text carries a user's personal data, which no answer shared across users may depend on.

An answer computed from "my account number is 12345678" must never reach another user, so
a turn whose question or context carries personal data is not cached at all. The check is a
deliberately broad set of patterns, not a PII classifier: numbers of four digits or more
(accounts, cards, phones, PINs, dates), e-mail addresses, and first-person statements that
introduce a value ("my name is ...", "I'm Alice", "call me ...", "I live in ..."). A false
positive costs one model call; a false negative could cost a leak, so when unsure it says yes.
It does not look for names or places said without such a lead-in ("Alice Smith here").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_PATTERNS = (
    re.compile(r"\d(?:[\s./-]?\d){3,}"),  # 4+ digits, spaced or dashed: 1234 5678, 555-0100
    re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),  # e-mail
    # "my name is", "my account number was", "my PIN: ..."
    re.compile(r"\b(?:my|our)\s+(?:[\w'-]+\s+){0,3}?(?:is|are|was|were|=|:)(?=\s|$)", re.IGNORECASE),
    re.compile(r"\b(?:my|our)\s+(?:[\w'-]+\s+){0,2}?[\w'-]+\s*[:=]", re.IGNORECASE),
    # a name after "I am", "I'm", "call me", "this is", "name's"
    re.compile(r"\b(?:[Ii] am|[Ii]'?m|[Cc]all me|[Tt]his is|[Nn]ame'?s)\s+[A-Z][\w'-]+"),
    re.compile(r"\b(?:I|we)\s+(?:live|lived|reside|was born|were born)\b", re.IGNORECASE),
)


def carries_personal_data(text: str) -> bool:
    """True when `text` may hold a value that belongs to its user (see the module docstring)."""
    return any(pattern.search(text) for pattern in _PATTERNS)


def any_personal_data(texts: Iterable[str]) -> bool:
    """True when any of `texts` carries personal data."""
    return any(carries_personal_data(text) for text in texts)

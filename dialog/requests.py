"""How many requests an English message makes, and whether it makes one at all: the rules the
dialogue manager reads a message's shape by, before its intent.

A decline ("I don't want to block my card", "no need to send it") names a request to refuse
it; read for its intent, it would start the very flow it refuses (or, worse, a neighbour:
"Shall I unblock your card's PIN?"). A message with two requests ("what's my balance and can
you also tell me your opening hours") gets one intent from the classifier, and the other
request would be dropped without a word.

Both rules put precision first, since a wrong match costs more than a miss: a false decline
ignores a real request, and a false split answers a question nobody asked. So a decline is only
a whole message that opens with one of a few declining phrases and goes on to name a request in
one clause ("I want to block my card, I don't want it used" is a request; so is "I don't want
to block it but to order a new one"), and only when what it declines is something the bot does
(the manager checks that the rest reads as an intent whose flow acts). A message is split only
at a sentence end or an "and"/"also" between clauses, and the manager keeps the split only when
both halves read as two different intents the bot handles. A bare "and" (no comma before it)
joins clauses only when what follows opens one (a pronoun, a question word, an auxiliary,
"please", "tell me"): "the terms and conditions of my account" is one request, though
"conditions of my account" alone may read as the balance, and "block my card and order a new
one" is missed, the cheaper error. What these rules do not do: other languages, more than two requests, or negations inside a request ("block the card I don't use").
"""

from __future__ import annotations

import re

_DECLINE = re.compile(
    r"^\s*(?:(?:no|ok(?:ay)?|thanks|actually),?\s+)?"
    r"(?:(?:i|we)\s+(?:really\s+|actually\s+)?(?:don'?t|do\s+not|won'?t|will\s+not)\s+(?:want|need|wish)(?:\s+you)?\s+to"
    r"|(?:i|we)(?:\s+would|'d)\s+rather\s+not"
    r"|(?:there'?s\s+|there\s+is\s+)?no\s+need\s+(?:for\s+you\s+)?to)"
    r"\s+(?P<request>[^,;:?!]+?)(?:\s+(?:any\s?more|any\s+longer|after\s+all|either))?[\s.!]*$",
    re.IGNORECASE,
)
_GOES_ON = re.compile(r"\b(?:but|instead|rather|just|only|except)\b", re.IGNORECASE)
"""A declined request followed by what is wanted instead: not a plain decline."""

_OPENS_A_CLAUSE = (
    r"(?=(?:i|i'm|i've|i'd|i'll|we|you|it|it's|what|what's|when|where|how|why|which|who"
    r"|is|are|can|could|will|would|do|does|did|shall|should|may|tell|show|give|let)\b)"
)
_BETWEEN_REQUESTS = re.compile(
    r"\s*[?.!;]\s+(?:and\s+|also,?\s+)?"
    r"|,\s*and\s+(?:(?:can|could|will|would)\s+you\s+)?(?:also\s+)?(?:please\s+)?"
    r"|\s+and\s+(?:(?:can|could|will|would)\s+you\s+(?:also\s+)?(?:please\s+)?|also\s+(?:please\s+)?|please\s+|" + _OPENS_A_CLAUSE + ")"
    r"|,\s*(?:also|plus)\s+",
    re.IGNORECASE,
)
MIN_WORDS = 3
"""Words each half of a split must have: "Apple Pay and Google Pay" is one request."""


def declined(text: str) -> str | None:
    """The request `text` declines ("block my card" of "I don't want to block my card"), or
    None when it is no plain decline of one request."""
    match = _DECLINE.match(text.replace("\u2019", "'"))  # a phone's typographic apostrophe
    if match is None or _GOES_ON.search(match.group("request")):
        return None
    return match.group("request").strip()


def two_requests(text: str) -> list[tuple[str, str]]:
    """The ways `text` may be read as two requests, (first, second), in the order of their
    boundaries in the text; empty when it has none. Which one holds is the classifier's call."""
    splits = []
    for boundary in _BETWEEN_REQUESTS.finditer(text.strip()):
        first, second = text.strip()[: boundary.start()].strip(), text.strip()[boundary.end() :].strip()
        if len(first.split()) >= MIN_WORDS and len(second.split()) >= MIN_WORDS:
            splits.append((first, second))
    return splits

"""What an answer is cached under: a scope, then the question.

The scope is applied before any vector search, so an entry can never cross it: the model's
weights, the bot (its system prompt), the tenant, and the dialogue context. A context-free
question (the first turn, or right after a topic change) is scoped to the whole bot; a
follow-up's scope includes a fingerprint of the confirmed intent and slots and of the recent
turns, never the last message alone: "how old is he?" means something else after each person.
When the dialogue state machine has confirmed an intent whose answers the bot marks cacheable,
the intent and its slot values become the scope instead of the recent turns, so every wording
of that intent shares its entries.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_KEY_CHARS = 2000  # longer questions are truncated for the key only

_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\s\W_]+|[\s\W_]+$")


def normalize(text: str) -> str:
    """Case, accents, spacing and edge punctuation do not change a question."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _EDGE_PUNCT.sub("", _SPACE.sub(" ", text))
    return text[:MAX_KEY_CHARS]


@dataclass(frozen=True)
class Scope:
    """Where an answer is valid. Two questions are compared only within one scope."""

    model: str
    bot: str
    tenant: str = "default"
    context: str = ""

    def key(self) -> str:
        raw = "\0".join((self.model, self.bot, self.tenant, self.context))
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


def bot_fingerprint(system_prompt: str | None) -> str:
    return hashlib.sha256((system_prompt or "").encode()).hexdigest()[:16]


def follow_up_context(recent_turns: Sequence[tuple[str, str]], facts: Mapping[str, str]) -> str:
    """Fingerprint of a follow-up's context: confirmed facts and the recent (role, text) turns."""
    parts = [f"{name}={value}" for name, value in sorted(facts.items())]
    parts += [f"{role}:{normalize(text)}" for role, text in recent_turns]
    return "ctx:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def intent_context(intent: str, slots: Mapping[str, str]) -> str:
    """Scope context of a confirmed cacheable intent: the intent and its slot values."""
    parts = [intent] + [f"{name}={value}" for name, value in sorted(slots.items())]
    return "intent:" + "|".join(parts)

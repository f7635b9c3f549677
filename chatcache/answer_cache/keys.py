"""What an answer is cached under: a scope, then the question.

The scope is applied before any vector search, so an entry can never cross it: the model's
weights, the bot (its system prompt), the tenant, the dialogue context, and the format the
reply was held to (a JSON schema, a grammar), if any. A context-free
question (the first turn, or right after a topic change) is scoped to the whole bot and shared
by its users. A follow-up's answer may depend on anything the model was shown, so its scope is
a fingerprint of the whole conversation that reaches the model (the system message with the
confirmed facts, every turn in the prompt window) and of the user: a shared last exchange is
not a shared context ("count from 1 to 5" after two different account numbers). When the
dialogue state machine has confirmed an intent whose answers the bot marks cacheable, the
intent and its slot values become the scope instead, so every wording of that intent shares
its entries. Which turns may be cached at all (none that carry personal data) is decided by
the caller, with `personal.py`.
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
    reply_format: str = ""  # the key of the format replies are held to; "" for free text

    def key(self) -> str:
        parts = (self.model, self.bot, self.tenant, self.context) + ((self.reply_format,) if self.reply_format else ())
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class AnswerScope:
    """Where one turn's answer is looked up and kept.

    Attributes:
        scope: the answer cache's scope.
        intent: it is a confirmed cacheable intent's scope (its own similarity threshold).
        across_users: users share it, so answers found by meaning must not echo another question.
        storable: this turn's answer may be kept there.
    """

    scope: Scope
    intent: bool
    across_users: bool
    storable: bool


def bot_fingerprint(system_prompt: str | None) -> str:
    return hashlib.sha256((system_prompt or "").encode()).hexdigest()[:16]


def conversation_context(owner: str, messages: Sequence[tuple[str, str]]) -> str:
    """Fingerprint of a follow-up's context: its owner and every (role, text) message the model sees.

    Texts are kept exactly (not normalised): the model sees them exactly, so two contexts that
    differ only in case may still get different answers.
    """
    digest = hashlib.sha256(owner.encode())
    for role, text in messages:
        digest.update(f"\0{role}\0{text}".encode())
    return "ctx:" + digest.hexdigest()[:32]


def intent_context(intent: str, slots: Mapping[str, str]) -> str:
    """Scope context of a confirmed cacheable intent: the intent and its slot values."""
    parts = [intent] + [f"{name}={value}" for name, value in sorted(slots.items())]
    return "intent:" + "|".join(parts)

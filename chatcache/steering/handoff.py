"""What a person taking over a handed-off conversation reads first: a summary of it.

Extractive, not generated: the intents the dialogue layer recognised, the facts the session
confirmed, and the customer's last messages, as stored. A 135M model's summary could invent
an account number; this one only repeats what was said and confirmed.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatcache.dialog import State
from chatcache.storage import Fact, Message

LAST_MESSAGES = 6  # the customer's messages quoted at the end
HANDED_OFF = State.HANDED_OFF.value  # the dialogue state of a conversation a person has taken over


def handoff_summary(messages: Sequence[Message], facts: Sequence[Fact]) -> str:
    """A few lines for the agent: what the customer asked about, what is confirmed, what they said last."""
    intents: list[str] = []
    for message in messages:
        intent = (message.meta or {}).get("intent")
        if message.role.value == "assistant" and isinstance(intent, str) and intent != "out_of_scope" and intent not in intents:
            intents.append(intent)
    said = [m.content for m in messages if m.role.value == "user"][-LAST_MESSAGES:]
    lines = [f"Asked about: {', '.join(i.replace('_', ' ') for i in intents) or 'nothing the bot recognised'}."]
    known = [f"{f.name.replace('_', ' ')}: {f.value}" for f in facts if f.kind.value == "slot"]
    if known:
        lines.append(f"Confirmed: {'; '.join(known)}.")
    lines.append("Last messages from the customer:")
    lines += [f"- {text}" for text in said]
    return "\n".join(lines)

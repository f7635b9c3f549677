"""Follow-ups in context: `chatcache eval context --data DIALOGUES.jsonl --json`.

"And for two people?" means one thing after a restaurant search and another after a flight
search. This evaluation runs SGD conversations (each dialogue one user, its system turns
standing in for the model's answers) through the answer cache exactly as the engine keys it
(`answer_scope`: personal data never cached, a first question shared by the bot's users, a
follow-up only by its own user after exactly the same conversation), in two halves:

  * the first half warms the cache, every turn stored under its own scope; replaying those
    turns, each in its own conversation, gives `hit_rate` (the same follow-up in the same
    context should be served, and with its own answer);
  * the second half is only looked up, each turn in its own conversation: its own answers are
    not in the cache, so any follow-up served is another conversation's answer, and
    `false_hit_rate` counts them. `repeated_follow_ups` are the cases this is about: follow-up
    texts that a warmed conversation also said (normalised), such as "that works for me".

First questions are reported apart (`first_question_hit_rate`): they are shared across users on
purpose, and an answer served to one is the answer to the same question with no context. Also
reported: the same run keyed the way semantic caches without context do (one scope for every
turn, as GPTCache's default), which is what the scope prevents.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..answer_cache import AnswerCache, AnswerCacheConfig, AnswerScope, Scope
from ..answer_cache.answering import answer_scope
from ..answer_cache.keys import normalize
from ..model.prompt import Message
from ..steering.hcac import TurnContext
from ..tiers.conversations import Conversation
from .answer_cache import Embed, _bundled_embed, _unit

BASE = Scope("eval-model", "eval-bot", "eval-tenant")
SYSTEM = "You are the assistant of a travel and lifestyle concierge service."


@dataclass(frozen=True)
class ContextTurn:
    """One user turn of an SGD dialogue, with what came before it and the system's answer."""

    dialogue: str
    index: int
    question: str
    answer: str
    before: tuple[tuple[str, str], ...]  # (user, system) exchanges earlier in the dialogue

    def conversation(self) -> Conversation:
        turns = [Message(role, text) for user, system in self.before for role, text in (("user", user), ("assistant", system))]
        return Conversation(self.dialogue, Message("system", SYSTEM), turns=turns)


def load_turns(path: str | Path, dialogues: int) -> list[list[ContextTurn]]:
    """The user turns (each followed by a system turn) of the first `dialogues` SGD dialogues."""
    conversations: list[list[ContextTurn]] = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if len(conversations) == dialogues:
                break
            record = json.loads(line)
            spoken = [(t["speaker"], t["utterance"]) for t in record["turns"]]
            exchanges = [(user, system) for (who, user), (by, system) in zip(spoken, spoken[1:]) if who == "USER" and by == "SYSTEM"]
            conversations.append(
                [ContextTurn(record["dialogue_id"], i, user, system, tuple(exchanges[:i])) for i, (user, system) in enumerate(exchanges)]
            )
    return conversations


def evaluate_context(
    path: str | Path, dialogues: int = 400, config: AnswerCacheConfig | None = None, embed: Embed | None = None
) -> dict[str, Any]:
    """Warm with the first half of the dialogues, replay them, then look up the second half.

    Returns:
        hit_rate, false_hit_rate, first_question_hit_rate, counts, the false hits found, and
        the same figures with one scope for every turn ("without_context").
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    conversations = load_turns(path, dialogues)
    warmed, unseen = conversations[: len(conversations) // 2], conversations[len(conversations) // 2 :]
    texts = sorted({turn.question for conversation in conversations for turn in conversation})
    vectors = dict(zip(texts, _unit(embed(texts))))
    result = _run(warmed, unseen, vectors, config, keyed=True)
    result["without_context"] = {k: v for k, v in _run(warmed, unseen, vectors, config, keyed=False).items() if k != "false_hits"}
    result["dialogues"] = {"warmed": len(warmed), "looked_up": len(unseen)}
    return result


def _scope(turn: ContextTurn, keyed: bool) -> AnswerScope | None:
    if not keyed:  # a semantic cache that knows no context: one scope for every question
        return AnswerScope(BASE, intent=False, across_users=True, storable=True)
    return answer_scope(BASE, f"user-{turn.dialogue}", turn.conversation(), TurnContext(), turn.question)


def _lookup(cache: AnswerCache, turn: ContextTurn, where: AnswerScope, vector: np.ndarray) -> str | None:
    hit = cache.lookup(turn.question, where.scope, embedding=vector, intent_scoped=where.intent, across_users=where.across_users)
    return hit.answer if hit is not None else None


def _run(
    warmed: list[list[ContextTurn]], unseen: list[list[ContextTurn]], vectors: dict[str, np.ndarray], config: AnswerCacheConfig, keyed: bool
) -> dict[str, Any]:
    cache = AnswerCache(config, lambda texts: np.stack([vectors[t] for t in texts]))
    stored: list[tuple[ContextTurn, AnswerScope]] = []
    for turn in (t for conversation in warmed for t in conversation):
        where = _scope(turn, keyed)
        if where is not None and where.storable:
            cache.store(turn.question, turn.answer, where.scope, 0.0, 100.0, embedding=vectors[turn.question])
            stored.append((turn, where))
    cache.calibrate()
    follow_ups = [(turn, where) for turn, where in stored if turn.index > 0]
    own = [_lookup(cache, turn, where, vectors[turn.question]) == turn.answer for turn, where in follow_ups]
    said = {normalize(turn.question) for turn, _ in follow_ups}
    looked_up, first, false_hits = 0, [], []
    repeated = repeated_served = 0
    for turn in (t for conversation in unseen for t in conversation):
        where = _scope(turn, keyed)
        if where is None:
            continue  # never cached: personal data
        served = _lookup(cache, turn, where, vectors[turn.question])
        if turn.index == 0:
            first.append(served is not None)
            continue
        looked_up += 1
        repeat = normalize(turn.question) in said
        repeated += repeat
        if served is not None:
            repeated_served += repeat
            false_hits.append({"dialogue": turn.dialogue, "question": turn.question, "served": served})
    return {
        "hit_rate": round(float(np.mean(own)), 4) if own else 0.0,
        "false_hit_rate": round(len(false_hits) / looked_up, 4) if looked_up else 0.0,
        "first_question_hit_rate": round(float(np.mean(first)), 4) if first else 0.0,
        "repeated_follow_ups": repeated,
        "repeated_follow_ups_served": repeated_served,
        "follow_ups_replayed": len(own),
        "follow_ups_looked_up": looked_up,
        "false_hits": false_hits[:20],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval context --data DIALOGUES.jsonl [--dialogues N] [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval context", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="SGD dialogues, one JSON object per line")
    parser.add_argument("--dialogues", type=int, default=400, help="how many, from the start of the file (default 400)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = evaluate_context(args.data, args.dialogues)
    if args.json:
        print(json.dumps(result))
        return 0
    for name, row in (("cache", result), ("no context", result["without_context"])):
        print(
            f"{name:12} hit_rate={row['hit_rate']:.4f} false_hit_rate={row['false_hit_rate']:.4f} "
            f"first_question_hit_rate={row['first_question_hit_rate']:.4f} "
            f"repeated follow-ups served {row['repeated_follow_ups_served']}/{row['repeated_follow_ups']}"
        )
    return 0

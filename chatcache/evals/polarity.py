"""Questions against their opposites: `chatcache eval polarity`.

Semantic caches serve "how do I turn off notifications?" the answer stored for "how do I turn
on notifications?": the embeddings of a question and its opposite are near neighbours. This
evaluation builds such pairs by rule from real questions (BANKING77's, GPTCache's) and asks, one
fresh cache per pair, whether the opposite is served the question's answer. Two rules, each
applied where it fits:
  * negation: a negative auxiliary turned positive ("has not been delivered" -> "has been
    delivered", "didn't" -> "did"), else the first auxiliary turned negative ("did" -> "didn't").
    Questions with any other negation ("no", "never", a second "not") are left out, and so are the auxiliaries
    whose negation asks the same ("can you" -> "can't you", a question's opening "is" ->
    "isn't") or is not English ("how do I" -> "how don't I");
  * opposite: the first word with an antonym in `OPPOSITES` swapped for it ("increase" ->
    "decrease", "turn on" -> "turn off").
No opposite should be served (0 in the published set), while the GPTCache paraphrases of the same
questions still should: both are reported, with the cache as configured, without its
verification, and for the embedding-only baseline (the nearest question above a cosine cut-off).

The antonym list is the generator's, not the cache's: the verifier knows no such list (it
refuses a changed negation and one short span replaced by another word), so a pair refused here
is refused by a rule that holds beyond this list.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..answer_cache import AnswerCacheConfig
from .answer_cache import BASELINE_THRESHOLD, Embed, _bundled_embed, _unit, load_questions
from .answer_cache_pairs import load_positives, pair_hits

_AUXILIARIES = {
    "is": "isn't", "are": "aren't", "was": "wasn't", "were": "weren't", "do": "don't", "does": "doesn't",
    "did": "didn't", "can": "can't", "could": "couldn't", "will": "won't", "would": "wouldn't",
    "should": "shouldn't", "has": "hasn't", "have": "haven't",
}  # fmt: skip
_POSITIVE = {negative: positive for positive, negative in _AUXILIARIES.items()} | {"cannot": "can", "wont": "will"}
_NEGATIONS = re.compile(r"\b(not|no|never|nothing|none|nobody|neither|nor|without|nowhere|cannot)\b|n't\b", re.IGNORECASE)

_ANTONYMS = [
    ("increase", "decrease"), ("raise", "lower"), ("higher", "lower"), ("more", "less"), ("maximum", "minimum"),
    ("add", "remove"), ("activate", "deactivate"), ("enable", "disable"), ("lock", "unlock"), ("block", "unblock"),
    ("freeze", "unfreeze"), ("open", "close"), ("start", "stop"), ("turn on", "turn off"), ("switch on", "switch off"),
    ("log in", "log out"), ("sign in", "sign out"), ("deposit", "withdraw"), ("send", "receive"),
    ("sent", "received"), ("buy", "sell"), ("accept", "decline"), ("accepted", "declined"), ("approve", "reject"),
    ("approved", "rejected"), ("before", "after"), ("earlier", "later"), ("incoming", "outgoing"),
    ("include", "exclude"), ("upload", "download"), ("import", "export"), ("first", "last"), ("fast", "slow"),
    ("faster", "slower"), ("longer", "shorter"), ("best", "worst"), ("good", "bad"), ("cheap", "expensive"),
    ("advantages", "disadvantages"), ("positive", "negative"), ("success", "failure"), ("legal", "illegal"),
    ("possible", "impossible"), ("safe", "unsafe"), ("healthy", "unhealthy"), ("agree", "disagree"),
    ("join", "leave"), ("inside", "outside"), ("above", "below"), ("win", "lose"), ("love", "hate"),
    ("hot", "cold"), ("old", "new"), ("rich", "poor"), ("easy", "hard"), ("strong", "weak"),
]  # fmt: skip
OPPOSITES = dict(_ANTONYMS) | {b: a for a, b in _ANTONYMS}
_OPPOSITE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, OPPOSITES), key=len, reverse=True)) + r")\b", re.IGNORECASE)
_NEGATIVE_AUXILIARY = re.compile(
    r"\b(" + "|".join(map(re.escape, _POSITIVE)) + r")\b|\b(" + "|".join(_AUXILIARIES) + r") not\b", re.IGNORECASE
)
# An auxiliary to negate: not after "how" ("how don't I") and not before "you" ("can't you" asks the same).
_AUXILIARY = re.compile(r"(?<!how )\b(" + "|".join(_AUXILIARIES) + r")\b(?! you\b)", re.IGNORECASE)


def _same_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def negated(question: str) -> str | None:
    """`question` with its polarity flipped by one auxiliary, or None when no rule fits."""
    negations = len(_NEGATIONS.findall(question))
    negative = _NEGATIVE_AUXILIARY.search(question)
    if negations > 1 or (negations == 1 and negative is None):
        return None  # which negation to flip, or how, is not clear
    if negative is not None:
        if negative.group(1) is not None:  # a contraction or "cannot"
            word = negative.group(1)
            positive = _same_case(_POSITIVE[word.lower()], word)
        else:  # "has not": the "not" goes
            positive = negative.group(2)
        return question[: negative.start()] + positive + question[negative.end() :]
    for found in _AUXILIARY.finditer(question):
        before = question[: found.start()].rstrip()
        if not before or before[-1] in ".?!":
            continue  # "Is my card blocked?" and "Isn't my card blocked?" ask the same
        word = found.group(1)
        return question[: found.start()] + _same_case(_AUXILIARIES[word.lower()], word) + question[found.end() :]
    return None


def opposite(question: str) -> str | None:
    """`question` with its first word that has an antonym swapped for it, or None."""
    found = _OPPOSITE.search(question)
    if found is None:
        return None
    word = found.group(1)
    return question[: found.start()] + _same_case(OPPOSITES[word.lower()], word) + question[found.end() :]


def polar_pairs(questions: Iterable[str]) -> list[tuple[str, str, str]]:
    """(question, its opposite, the rule) for every question a rule fits, without repeats."""
    pairs: dict[tuple[str, str], str] = {}
    for question in questions:
        for rule, flip in (("negation", negated), ("opposite", opposite)):
            flipped = flip(question)
            if flipped is not None and flipped.lower() != question.lower():
                pairs.setdefault((question, flipped), rule)
    return [(question, flipped, rule) for (question, flipped), rule in pairs.items()]


def evaluate_polarity(
    banking_csv: str | Path,
    positives_json: str | Path,
    config: AnswerCacheConfig | None = None,
    embed: Embed | None = None,
) -> dict[str, Any]:
    """Opposites served (should be 0) and, for the GPTCache questions among them, paraphrases served.

    Returns:
        opposites_served (count), opposite_hit_rate, paraphrase_hit_rate, counts per rule, the
        opposites that were served, and the same rates without verification and embedding-only.
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    positives = load_positives(positives_json)
    questions = [text for text, _ in load_questions(banking_csv)] + [origin for origin, _ in positives]
    pairs = polar_pairs(questions)
    polar_origins = {question for question, _, _ in pairs}
    paraphrases = [(origin, similar) for origin, similar in positives if origin in polar_origins]
    opposites = [(question, flipped) for question, flipped, _ in pairs]
    texts = sorted({text for pair in [*opposites, *paraphrases] for text in pair})
    vectors = dict(zip(texts, _unit(embed(texts))))
    result: dict[str, Any] = {}
    for key, run_config in (("main", config), ("without_verification", replace(config, verify=False))):
        served = pair_hits(opposites, vectors, run_config, embed)
        rates = {
            "opposites_served": int(sum(served)),
            "opposite_hit_rate": round(float(np.mean(served)), 4),
            "paraphrase_hit_rate": round(float(np.mean(pair_hits(paraphrases, vectors, run_config, embed))), 4),
        }
        if key == "main":
            result.update(rates)
            result["served_opposites"] = [list(pair) for pair, hit in zip(opposites, served) if hit]
        else:
            result[key] = rates
    result["pairs"] = {"opposites": len(opposites), "paraphrases": len(paraphrases)}
    result["pairs_by_rule"] = {rule: sum(r == rule for _, _, r in pairs) for rule in ("negation", "opposite")}
    result["embedding_only"] = {
        f"{t:.2f}": {
            "opposite_hit_rate": round(float(np.mean([vectors[a] @ vectors[b] >= t for a, b in opposites])), 4),
            "paraphrase_hit_rate": round(float(np.mean([vectors[a] @ vectors[b] >= t for a, b in paraphrases])), 4),
        }
        for t in sorted({config.similarity_threshold, BASELINE_THRESHOLD})
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval polarity --banking FILE.csv --positives FILE.json [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval polarity", description=__doc__.splitlines()[0])
    parser.add_argument("--banking", required=True, help="questions to flip, CSV text,category (BANKING77's train.csv)")
    parser.add_argument("--positives", required=True, help="GPTCache mock pairs, JSON list of origin/similar")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = evaluate_polarity(args.banking, args.positives)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [("cache", result), ("no verify", result["without_verification"])]
    rows += [(f"emb-only {t}", row) for t, row in result["embedding_only"].items()]
    for name, row in rows:
        served = f" served={row['opposites_served']}" if "opposites_served" in row else ""
        print(f"{name:16} opposite_hit_rate={row['opposite_hit_rate']:.4f}{served} paraphrase_hit_rate={row['paraphrase_hit_rate']:.4f}")
    return 0

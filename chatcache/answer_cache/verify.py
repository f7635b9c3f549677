"""Verification: a near-duplicate question that means something else must not get the answer.

Embeddings put "Is John older than Mary?" next to "Is Mary older than John?" and "function of
TV" next to "function of money". These model-free checks run on the matched pair after the
vector search and refuse the hit when the texts differ in what makes an answer different:
  * numbers (amounts, dates, counts);
  * negation;
  * the same content words in another order (swapped roles or entities);
  * one short span replaced by another content word (a different entity).
What the checks cost in hits is measured by `chatcache eval pairs` and `eval answer-cache`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_NEGATION = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"}
STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being am do does did
    i me my you your he him his she her it its we our they them their this that these those there here what which
    who whom whose when where why how can could would should will shall may might must have has had having
    so than too very just also about into over under again then once any some such only own same all each
    please want need like get got would'd let lets i'm i've i'd you're it's that's what's how's""".split()
)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("n't", " not"))


def content_words(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t not in STOPWORDS and not t.isdigit()]


def verify(query: str, cached: str) -> Verdict:
    """Whether the answer to `cached` may be served for `query`."""
    if sorted(_NUMBER.findall(query)) != sorted(_NUMBER.findall(cached)):
        return Verdict(False, "numbers differ")
    q_words, c_words = words(query), words(cached)
    if bool(_NEGATION & set(q_words)) != bool(_NEGATION & set(c_words)):
        return Verdict(False, "negation differs")
    q_content, c_content = content_words(q_words), content_words(c_words)
    if q_content != c_content and sorted(q_content) == sorted(c_content):
        return Verdict(False, "same words, other roles")
    replaced = _replaced_spans(q_words, c_words)
    if len(replaced) == 1:
        before, after = replaced[0]
        if content_words(before) and content_words(after) and len(before) <= 2 and len(after) <= 2:
            return Verdict(False, f"different entity: {' '.join(before)!r} vs {' '.join(after)!r}")
    return Verdict(True)


def _replaced_spans(a: list[str], b: list[str]) -> list[tuple[list[str], list[str]]]:
    """Spans that differ between two word lists, when that is the only difference."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    spans = [(a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    return spans

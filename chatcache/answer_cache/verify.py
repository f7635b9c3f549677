"""Verification: a near-duplicate question that means something else must not get the answer.

Embeddings put "Is John older than Mary?" next to "Is Mary older than John?" and "function of
TV" next to "function of money". These model-free checks run on the matched pair after the
vector search and refuse the hit when the texts differ in what makes an answer different:
  * numbers (amounts, dates, counts);
  * negation, when the rest of the wording is largely shared: one text negates more often than
    the other ("why did I get 20" and "why didn't I get 20"; a second clause's "don't" turned
    "do" in a long message); a rewording that says the same thing with "can't" and without is
    left to the embedding;
  * the same content words in another order: mostly shared words whose order changed, or two
    words that took each other's role (the preposition before them: "from X to Y", "from Y to X");
  * one short span replaced by another, a content word on at least one side (a different
    entity, or an opposite: "turn on" and "turn off", "log in" and "log out"), unless the two
    are forms of one word ("delivery" and "deliveries");
  * in a near-copy (most words the same, in the same order), a content word or a preposition
    that moved ("After the death of Ali, Muawiyah came to power" and "After the death of
    Muawiyah, Ali came ..."), or one or two content words replaced among other small edits.
    The embedding cannot tell such texts apart: nearly all their words agree, so their
    similarity is high whatever the edit did. A rewording that changes most of the wording is
    left to the embedding and the checks above.
It does not parse, so a reordering that keeps the meaning ("a refund for what I bought" and
"I bought something I need a refund for") is refused too: a miss costs a model call, a false
hit a wrong answer. What the checks cost in hits is measured by `chatcache eval pairs` and
`eval answer-cache`.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_NEGATION = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"} | {
    # Contractions typed without their apostrophe ("my card wont work").
    "dont", "doesnt", "didnt", "cant", "wont", "isnt", "arent", "wasnt", "werent", "havent", "hasnt", "couldnt",
    "wouldnt", "shouldnt",
}  # fmt: skip
# Words, and the punctuation that ends a phrase (a preposition governs no word past a comma).
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[,;:.!?()\"]")
_ROLE_WORDS = frozenset(
    """from to in on at by for with of than into onto over under between after before during about
    against through toward towards via per as""".split()
)
STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from as is are was were be been being am do does did
    i me my you your he him his she her it its we our they them their this that these those there here what which
    who whom whose when where why how can could would should will shall may might must have has had having
    so than too very just also about into over under again then once any some such only own same all each
    please want need like get got would'd let lets i'm i've i'd you're it's that's what's how's""".split()
)
SHARED_FOR_ORDER = 0.8  # share of the shorter text's content words both must have for the order check
SHARED_FOR_NEGATION = 0.5  # the same share for the negation check
STEM_CHARS = 5  # words agreeing on this many leading characters are forms of one word
# Share of two texts' words that match in order (difflib's ratio) from which they are near-copies
# (tuned on PAWS dev, where served paraphrases from GPTCache's mock data are mostly below 0.7 and
# served PAWS hard negatives mostly above); a higher bar for the content-span check, which
# costs more rewordings.
NEAR_COPY = 0.75
NEAR_COPY_FOR_SPAN = 0.85


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("n't", " not"))


def content_words(tokens: list[str]) -> list[str]:
    """The words that carry what a text is about: no function words, numbers or negations
    (numbers and negations have checks of their own)."""
    return [t for t in tokens if t not in STOPWORDS and t not in _NEGATION and not t.isdigit()]


def verify(query: str, cached: str) -> Verdict:
    """Whether the answer to `cached` may be served for `query`."""
    if sorted(_NUMBER.findall(query)) != sorted(_NUMBER.findall(cached)):
        return Verdict(False, "numbers differ")
    q_words, c_words = words(query), words(cached)
    q_content, c_content = content_words(q_words), content_words(c_words)
    shared = _shared_share(q_content, c_content)
    if _negations(q_words) != _negations(c_words) and shared >= SHARED_FOR_NEGATION:
        return Verdict(False, "negation differs")
    if shared >= SHARED_FOR_ORDER and _inverted(q_content, c_content):
        return Verdict(False, "same words, other roles")
    swapped = _role_swap(query, cached)
    if swapped:
        return Verdict(False, f"same words, other roles: {swapped[0]!r} and {swapped[1]!r} swapped")
    replaced = _replaced_spans(q_words, c_words)
    if len(replaced) == 1:
        before, after = replaced[0]
        b_content, a_content = content_words(before), content_words(after)
        replaced_word = before and after and (b_content or a_content)
        if replaced_word and len(before) <= 2 and len(after) <= 2 and not _same_stems(b_content, a_content):
            return Verdict(False, f"different entity: {' '.join(before)!r} vs {' '.join(after)!r}")
    near = difflib.SequenceMatcher(a=q_words, b=c_words, autojunk=False).ratio()
    if near >= NEAR_COPY:
        moved = _moved(_skeleton(q_words), _skeleton(c_words))
        if moved:
            return Verdict(False, f"word moved: {moved!r}")
    if near >= NEAR_COPY_FOR_SPAN:
        # The content words alone: a date written another way or an article dropped beside the
        # replaced word leaves the rule on all words with two spans.
        matcher = difflib.SequenceMatcher(a=_stems_of(q_content), b=_stems_of(c_content), autojunk=False)
        ops = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
        if len(ops) == 1:
            before, after = q_content[ops[0][0] : ops[0][1]], c_content[ops[0][2] : ops[0][3]]
            small = 0 < len(before) <= 2 and 0 < len(after) <= 2
            if small and not _same_stems(sorted(before), sorted(after)):
                return Verdict(False, f"different entity: {' '.join(before)!r} vs {' '.join(after)!r}")
    return Verdict(True)


def stems(text: str) -> set[str]:
    """The content words of `text`, each cut to its first letters (forms of one word agree)."""
    return {w[:STEM_CHARS] for w in content_words(words(text))}


def echoes_particulars(query: str, cached: str, answer: str, common: frozenset[str] = frozenset()) -> bool:
    """Whether `answer` repeats words of the question it was written for that `query` lacks.

    An answer shared between users can carry one user's data only by repeating their question
    ("Dear team, Jane Doe has the flu" for a note about Jane Doe). A paraphrase has no business
    getting such an answer, whatever the words are (a name, a place, a condition), so no list of
    what counts as personal is needed. `common` are stems that belong to no user: the bot's own
    words (its prompt, its intents' examples), so "opening hours" in an answer about opening
    hours is not a particular.
    """
    particular = stems(cached) - stems(query) - common
    return bool(particular & stems(answer))


def _negations(tokens: list[str]) -> int:
    return sum(t in _NEGATION for t in tokens)


def _shared_share(a: list[str], b: list[str]) -> float:
    """Share of the shorter text's distinct content words that the other text has too (1 when
    neither has any: texts of function words alone share all they have)."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / min(len(sa), len(sb)) if sa and sb else 0.0


def _inverted(a: list[str], b: list[str]) -> bool:
    """Whether two words both texts share come in the opposite order in `b`."""
    first: dict[str, int] = {}
    for i, w in enumerate(a):
        first.setdefault(w, i)
    order = [first[w] for w in dict.fromkeys(b) if w in first]
    return any(x > y for x, y in zip(order, order[1:]))


def _roles(text: str) -> Counter[tuple[str, str]]:
    """How often each content word comes with each role: the preposition before it in its
    phrase, "" when there is none (punctuation ends a phrase)."""
    roles: Counter[tuple[str, str]] = Counter()
    role = ""
    for t in _TOKEN.findall(text.lower().replace("n't", " not")):
        if t in _ROLE_WORDS:
            role = t
        elif not t[0].isalnum():
            role = ""
        elif t not in STOPWORDS and t not in _NEGATION and not t.isdigit():
            roles[t, role] += 1
    return roles


def _role_swap(a: str, b: str) -> tuple[str, str] | None:
    """Two shared words that traded roles ("from X to Y" and "from Y to X"), if any. Every
    occurrence counts, so a word that keeps its role once and trades it later is seen."""
    ra, rb = _roles(a), _roles(b)
    gained, lost = set(ra - rb), set(rb - ra)
    for w1, now1 in gained:
        for w2, now2 in gained:
            if w1 != w2 and now1 and now2 and now1 != now2 and (w1, now2) in lost and (w2, now1) in lost:
                return w1, w2
    return None


def _skeleton(tokens: list[str]) -> list[str]:
    """Content words (cut to their stems) and prepositions, in order: what a reordering moves.
    A preposition before a number is left out: "in 1988" goes anywhere in a sentence."""
    kept = []
    for i, t in enumerate(tokens):
        if t in _ROLE_WORDS:
            if i + 1 == len(tokens) or not tokens[i + 1].isdigit():
                kept.append(t)
        elif t not in STOPWORDS and t not in _NEGATION and not t.isdigit():
            kept.append(t[:STEM_CHARS])
    return kept


def _moved(a: list[str], b: list[str]) -> str | None:
    """A word that left one place in `a` and turned up at another in `b`, if any."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    spans = [(a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    for i, (gone_here, came_here) in enumerate(spans):
        for j, (gone_there, came_there) in enumerate(spans):
            moved = (set(gone_here) & set(came_there)) - set(came_here) - set(gone_there)
            if i != j and moved:
                return min(moved)
    return None


def _stems_of(tokens: list[str]) -> list[str]:
    return [t[:STEM_CHARS] for t in tokens]


def _same_stems(a: list[str], b: list[str]) -> bool:
    return len(a) == len(b) and all(x[:STEM_CHARS] == y[:STEM_CHARS] for x, y in zip(a, b))


def _replaced_spans(a: list[str], b: list[str]) -> list[tuple[list[str], list[str]]]:
    """Spans that differ between two word lists, when that is the only difference."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    spans = [(a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    return spans

"""How `chatcache eval answer-cache` and `eval pairs` score what a run served, and the thresholds
their calibrated baselines certify.

A run's error rate is wrong answers among those it served, with a two-sided exact
(Clopper-Pearson) interval: the bound the cache promises is one-sided, but a measurement is
reported with both ends. Certified thresholds use the cache's own test (`bound.last_certified`,
fixed-sequence testing from strict to loose), so a baseline and the cache are held to one rule.

The label-noise rule, stated here before any figure was measured with it and never used to tune
anything: a served-but-wrong test question counts as label noise iff the training data holds a
question labelled with the answer served that is either the same text once normalised
(`keys.normalize`) or a near-copy of it (difflib's ratio over the two word lists at least 0.9,
the verifier's measure, and `verify()` passing). The data then says two things about one
question, and no cache can be right on both. The rule undercounts on purpose: a wrong answer
whose question merely resembles a mislabelled one ("the status of my new card" filed under a
lost card) stays an error.

This module embeds nothing and runs no cache; it works on vectors and answers given to it.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..answer_cache import normalize, verify
from ..answer_cache.bound import interval, last_certified, min_evidence, upper_bound
from ..answer_cache.decision import PATH, OperatingPoint
from ..answer_cache.verify import words

Row = tuple[str, str]
"""One labelled question: (text, category); the category stands in for the model's answer."""

NOISE_NEAR_COPY = 0.9  # difflib word ratio from which a training question is a near-copy (the rule above)
# Cosine thresholds the calibrated embedding-only baseline tries, strict to loose, fixed in advance.
COSINE_STEPS = tuple(round(0.99 - 0.01 * i, 2) for i in range(50))
_CHUNK = 1024  # query rows per similarity block: 15,000 stored MiniLM rows stay near 60 MB a block


@dataclass(frozen=True)
class WrongAnswer:
    """A test question served another question's answer.

    Attributes:
        via: the stored question that vouched for the answer, where the run says which.
        label_noise: whether the label-noise rule (module docstring) explains it.
    """

    question: str
    expected: str
    served: str
    via: str | None
    label_noise: bool


class LabelNoise:
    """The label-noise rule over the training questions, each with the answer it was stored with."""

    def __init__(self, stored: Sequence[Row]) -> None:
        self._by_answer: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
        for text, answer in stored:
            self._by_answer[answer].append((text, normalize(text), words(text)))
        self._seen: dict[tuple[str, str], bool] = {}

    def explains(self, question: str, served: str) -> bool:
        """Whether a training question labelled `served` is `question` itself or a verified near-copy."""
        key = (question, served)
        if key not in self._seen:
            self._seen[key] = self._explains(question, served)
        return self._seen[key]

    def _explains(self, question: str, served: str) -> bool:
        normalized, asked = normalize(question), words(question)
        for text, text_normalized, text_words in self._by_answer.get(served, ()):
            if text_normalized == normalized:
                return True
            near = difflib.SequenceMatcher(a=asked, b=text_words, autojunk=False).ratio()
            if near >= NOISE_NEAR_COPY and verify(question, text).ok:
                return True
        return False


def score_served(
    served: Sequence[str | None],
    test: Sequence[Row],
    oos_label: str,
    noise: LabelNoise,
    confidence: float,
    via: Sequence[str | None] | None = None,
    list_wrong: bool = False,
) -> dict[str, Any]:
    """Hit rate, error rate with its interval, out-of-scope questions served, and label noise.

    Args:
        served: per test question, the answer served or None.
        test: the test questions; one whose category is `oos_label` has no right answer, so
            anything served to it is wrong.
        via: per test question, the stored question that vouched for the answer (listed with
            wrong answers).
        list_wrong: add every wrong answer, as `WrongAnswer` fields, under "wrong_answers".

    Returns:
        hit_rate, error_rate = wrong / hits, error_interval (two-sided, `confidence`), hits,
        wrong, questions, oos_questions, oos_served, label_noise (wrong answers the rule explains)
        and error_rate_without_noise = (wrong - label_noise) / hits.
    """
    wrong: list[WrongAnswer] = []
    for i, (answer, (question, category)) in enumerate(zip(served, test)):
        if answer is not None and (answer != category or category == oos_label):
            vouched = via[i] if via is not None else None
            wrong.append(WrongAnswer(question, category, answer, vouched, noise.explains(question, answer)))
    hits = sum(answer is not None for answer in served)
    oos = [answer for answer, (_, category) in zip(served, test) if category == oos_label]
    noisy = sum(w.label_noise for w in wrong)
    low, high = interval(len(wrong), hits, confidence)
    result: dict[str, Any] = {
        "hit_rate": round(hits / len(test), 4) if test else 0.0,
        "error_rate": round(len(wrong) / hits, 5) if hits else 0.0,
        "error_interval": [round(low, 5), round(high, 5)],
        "hits": hits,
        "wrong": len(wrong),
        "questions": len(test),
        "oos_questions": len(oos),
        "oos_served": sum(answer is not None for answer in oos),
        "label_noise": noisy,
        "error_rate_without_noise": round((len(wrong) - noisy) / hits, 5) if hits else 0.0,
    }
    if list_wrong:
        result["wrong_answers"] = [w.__dict__ for w in wrong]
    return result


def nearest(stored: np.ndarray, queries: np.ndarray, leave_one_out: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per query row, the index of its most similar stored row and that cosine (rows are unit vectors).

    With `leave_one_out`, `queries` is `stored` and each row's own index is skipped.
    """
    index = np.zeros(len(queries), dtype=np.int64)
    best = np.full(len(queries), -np.inf, dtype=np.float32)
    if len(stored) == 0:
        return index, best
    for start in range(0, len(queries), _CHUNK):
        block = queries[start : start + _CHUNK] @ stored.T
        rows = np.arange(len(block))
        if leave_one_out:
            block[rows, rows + start] = -np.inf
        index[start : start + len(block)] = block.argmax(axis=1)
        best[start : start + len(block)] = block[rows, index[start : start + len(block)]]
    return index, best


def certified_cosine(vectors: np.ndarray, answers: Sequence[str], max_error_rate: float, confidence: float) -> dict[str, Any]:
    """The loosest of `COSINE_STEPS` the stored questions certify for the embedding-only baseline.

    Each stored question is asked of the others (leave-one-out): its nearest other question's
    answer is right when it is its own answer (never, for an out-of-scope question: each has an
    answer of its own). The step is chosen as the cache chooses its point.

    Returns:
        threshold (None: nothing certified, the baseline serves nothing), and at that step the
        leave-one-out served count, errors and one-sided upper bound; min_evidence.
    """
    index, best = nearest(vectors, vectors, leave_one_out=True)
    own = np.asarray(answers, dtype=object)
    wrong = own[index] != own
    served = [int((best >= t).sum()) for t in COSINE_STEPS]
    errors = [int(((best >= t) & wrong).sum()) for t in COSINE_STEPS]
    step = last_certified(served, errors, max_error_rate, confidence)
    summary: dict[str, Any] = {"threshold": None, "min_evidence": min_evidence(max_error_rate, confidence)}
    if step is not None:
        n, k = served[step], errors[step]
        summary.update(threshold=COSINE_STEPS[step], served=n, errors=k, upper_bound=round(upper_bound(k, n, confidence), 5))
    return summary


@dataclass(frozen=True)
class PairTrial:
    """One calibration pair: whether it is a paraphrase, and the first step of `PATH` serving it (None: none)."""

    paraphrase: bool
    rank: int | None


def pair_rank(stored: str, asked: str, similarity: float, verify_on: bool) -> int | None:
    """The first step of `PATH` at which a one-entry scope holding `stored` serves `asked`.

    In a one-entry scope the vote has no rival and there is no head, so only the point's
    threshold and verification decide; an exact repeat is served at every step.
    """
    if normalize(stored) == normalize(asked):
        return 0
    if verify_on and not verify(asked, stored).ok:
        return None
    return next((i for i, point in enumerate(PATH) if similarity >= point.threshold), None)


def certified_pair_point(trials: Sequence[PairTrial], max_error_rate: float, confidence: float) -> dict[str, Any]:
    """The loosest step of `PATH` whose one-entry scopes hold both risks on the calibration pairs.

    Both the share of non-paraphrases served and the share of wrong answers among all pairs
    served must have a one-sided upper bound at most `max_error_rate`: the first is what a user
    of pairs asks, but alone it lets the wrong answers among few served grow (at 1% of 4,000
    negatives, 40 wrong against a few hundred right). Fixed-sequence testing as
    `bound.last_certified`: a step serving fewer than `min_evidence` pairs is passed over, the
    first step failing either bound ends the sequence.

    Returns:
        step and point (None: nothing certified), and at that step the pairs served, false
        hits, negatives, and both upper bounds.
    """
    needed = min_evidence(max_error_rate, confidence)
    negatives = sum(not t.paraphrase for t in trials)
    summary: dict[str, Any] = {"step": None, "point": None, "negatives": negatives, "min_evidence": needed}
    for step in range(len(PATH)):
        served = [t for t in trials if t.rank is not None and t.rank <= step]
        false_hits = sum(not t.paraphrase for t in served)
        if len(served) < needed:
            continue
        negatives_bound = upper_bound(false_hits, negatives, confidence)
        error_bound = upper_bound(false_hits, len(served), confidence)
        if max(negatives_bound, error_bound) > max_error_rate:
            break
        summary.update(
            step=step,
            point=point_summary(PATH[step]),
            served=len(served),
            false_hits=false_hits,
            negatives_upper_bound=round(negatives_bound, 5),
            error_upper_bound=round(error_bound, 5),
        )
    return summary


def point_summary(point: OperatingPoint) -> dict[str, float]:
    return {"threshold": point.threshold, "margin": point.margin, "head_confidence": point.head_confidence}

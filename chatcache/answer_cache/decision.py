"""Which stored answer a question asks for, and whether an operating point lets it be served.

A lookup and the calibration that chooses a scope's operating point (`calibration.py`) run the
same code: `read` finds the one answer a question asks for and how sure the cache is of it, and
`Reading.admits` says whether a point serves it. Verification comes after, in the caller: it
does not depend on the point except through which wordings clear the threshold.

Why one path of points instead of three knobs: a user sets the share of wrong answers they
accept (`AnswerCacheConfig.max_error_rate`) and the cache goes as far along `PATH` as its
evidence certifies. The path is nested (each point is no stricter than the one before in
threshold, margin and head confidence), so a question served at one point is served at every
later one, with the same answer, and each question has one rank: the first point serving it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .heads import AnswerHead

# An answer head's choice is served through its wordings among this many times `neighbors`
# nearest entries: enough to find those above the threshold, bounded for HNSW's sake.
HEAD_REACH = 5

@dataclass(frozen=True)
class OperatingPoint:
    """How sure a lookup must be to serve an answer by meaning.

    Attributes:
        threshold: cosine similarity a stored wording of the answer needs.
        margin: how much closer the best answer must be than the nearest different one (vote).
        head_confidence: how sure the scope's answer head must be of the answer (where it chooses).
    """

    threshold: float
    margin: float
    head_confidence: float

    def no_stricter_than(self, other: OperatingPoint) -> bool:
        return (
            self.threshold <= other.threshold
            and self.margin <= other.margin
            and self.head_confidence <= other.head_confidence
        )


def _segment(start: OperatingPoint, end: OperatingPoint, steps: int) -> list[OperatingPoint]:
    """`steps` points from `start` towards `end`, `end` excluded."""
    return [
        OperatingPoint(
            round(start.threshold + (end.threshold - start.threshold) * i / steps, 4),
            round(start.margin + (end.margin - start.margin) * i / steps, 4),
            round(start.head_confidence + (end.head_confidence - start.head_confidence) * i / steps, 4),
        )
        for i in range(steps)
    ]


# Strict to loose through the fixed configuration that served BANKING77 best (0.75, 0.12, 0.8),
# its knots chosen on BANKING77's training file only (`bench/answer_cache_bound.py`).
_STRICT = OperatingPoint(0.95, 0.30, 0.995)
_FIXED = OperatingPoint(0.75, 0.12, 0.8)
_LOOSE = OperatingPoint(0.60, 0.04, 0.5)
PATH: tuple[OperatingPoint, ...] = (*_segment(_STRICT, _FIXED, 30), *_segment(_FIXED, _LOOSE, 15), _LOOSE)


@dataclass(frozen=True)
class Reading:
    """The one answer a question asks for, before any point judges it.

    Attributes:
        answer_key: the normalised answer.
        wordings: stored wordings of that answer among the neighbours searched, closest first,
            as (entry id, similarity).
        head_probability: how sure the scope's answer head is of the answer; None when the
            neighbours' vote chose it.
        lead: how much closer the answer's best wording is than the nearest different answer's
            (infinite when no other answer is among the neighbours); the vote's margin applies to it.
    """

    answer_key: str
    wordings: tuple[tuple[int, float], ...]
    head_probability: float | None
    lead: float

    def admits(self, point: OperatingPoint) -> bool:
        """Whether `point` is sure enough of the answer (the head's probability, else the vote's lead)."""
        if self.head_probability is not None:
            return self.head_probability >= point.head_confidence
        return self.lead >= point.margin

    def wordings_from(self, threshold: float) -> list[tuple[int, float]]:
        return [(entry_id, similarity) for entry_id, similarity in self.wordings if similarity >= threshold]


def reach(neighbors: int, head: AnswerHead | None) -> int:
    """How many nearest stored wordings `read` is given: more when a head chooses the answer."""
    return neighbors * (HEAD_REACH if head is not None else 1)


def read(
    found: Sequence[tuple[int, float]],
    answer_of: Callable[[int], str],
    head: AnswerHead | None,
    vector: np.ndarray,
    neighbors: int,
) -> Reading | None:
    """The answer the nearest stored wordings `found` (closest first) point to; None when none were found.

    The head chooses when there is one and it knows the nearest wording's answer (and does not
    put the question among the rare answers); else the `neighbors` nearest vote, each answer
    counting its closest wording.
    """
    if not found:
        return None
    if head is not None and answer_of(found[0][0]) in head.known:
        answer, probability = head.predict(vector)
        if answer is not None:
            wordings = tuple((i, s) for i, s in found if answer_of(i) == answer)[:neighbors]
            return Reading(answer, wordings, probability, float("inf"))
    by_answer: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for entry_id, similarity in found[:neighbors]:
        by_answer[answer_of(entry_id)].append((entry_id, similarity))
    ranked = sorted(by_answer, key=lambda answer: by_answer[answer][0][1], reverse=True)
    best = by_answer[ranked[0]][0][1]
    lead = best - by_answer[ranked[1]][0][1] if len(ranked) > 1 else float("inf")
    return Reading(ranked[0], tuple(by_answer[ranked[0]]), None, lead)

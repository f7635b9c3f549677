"""How far along `decision.PATH` a scope may serve by meaning and keep its error under the user's bound.

Why leave-one-out over the scope's own stored wordings: every stored wording is a question with
a known answer, so asking each one of the scope without it is a trial of what a new question
gets, right or wrong, on exactly the data the cache serves from (the guarantee holds as far as
new questions resemble the stored ones; audits watch that on live traffic, `audits.py`). The
answer head a trial meets is fitted without it (five-fold cross-fitting: five fits, not one per
trial), and without its near-copies: a wording and the stored wordings nearly the same as it
(`NEAR_COPY`) are left out together, from the search and from the head's folds, so a scope whose
wordings of an answer are all near-copies of each other earns no evidence from them. A wording
whose answer no other wording shares stands for a question the scope cannot answer: whatever it
is served is wrong. `bound.last_certified` then picks the loosest point the trials certify at
the user's confidence; none means exact repeats only.

Compared on BANKING77's training file only with per-scope thresholds learnt online from audits
(vCache's way) and with Learn-then-Test on a calibration split set aside (`bench/answer_cache_bound.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from .bound import last_certified, min_evidence, upper_bound
from .decision import PATH, OperatingPoint, Reading, reach, read
from .heads import AnswerHead, fit_head
from .verify import verify

FOLDS = 5
# Stored wordings at least this alike (cosine, in chains) are one group, left out together: a
# trial is then judged as a question that has no near-copy among the stored ones. Without it,
# questions written apart from the stored ones fared worse than the trials said: CLINC150's
# validation questions were served at 1.14% wrong under a 1% bound (0.86% with groups at 0.9;
# 0.95 changed nothing, 0.85 cost BANKING77 more hits). BANKING77's held-out questions, which
# often have near-copies stored, are served less (56.4% instead of 67.1% at 1%).
NEAR_COPY = 0.9
# At most this many stored wordings are asked, chosen at random: enough evidence for any bound
# worth setting (a point is tested at 0.1% once it serves 7,752), bounded so that a huge scope
# calibrates in seconds.
MAX_TRIALS = 20_000
_CHUNK = 1024  # questions whose similarities to the whole scope are computed at once


@dataclass(frozen=True)
class Calibration:
    """What one scope's trials certified.

    Attributes:
        point: the loosest certified operating point; None serves exact repeats only.
        trials: how many stored wordings were asked.
        served: how many of them the chosen point serves (the loosest point's, when none is chosen).
        errors: how many of those were served another answer.
        upper: the upper confidence bound on the error rate of `served`.
        needed: how many trials a point must serve before it is tested (`bound.min_evidence`).
    """

    point: OperatingPoint | None
    trials: int
    served: int
    errors: int
    upper: float
    needed: int


@dataclass(frozen=True)
class Trial:
    """One stored wording asked of its scope without it: the first point serving it (None: none does) and whether that answer is wrong."""

    rank: int | None
    wrong: bool


def calibrate(
    trials: Sequence[Trial], max_error_rate: float, confidence: float, path: Sequence[OperatingPoint] = PATH
) -> Calibration:
    """The loosest point of `path` whose served trials certify `max_error_rate` at `confidence`."""
    ranks = np.array([len(path) if t.rank is None else t.rank for t in trials], dtype=np.int64)
    wrong = np.array([t.wrong for t in trials], dtype=bool)
    served = [int(np.sum(ranks <= step)) for step in range(len(path))]
    errors = [int(np.sum((ranks <= step) & wrong)) for step in range(len(path))]
    step = last_certified(served, errors, max_error_rate, confidence)
    at = len(path) - 1 if step is None else step
    return Calibration(
        point=None if step is None else path[step],
        trials=len(trials),
        served=served[at] if served else 0,
        errors=errors[at] if errors else 0,
        upper=upper_bound(errors[at], served[at], confidence) if served else 1.0,
        needed=min_evidence(max_error_rate, confidence),
    )


def leave_one_out(
    vectors: np.ndarray,
    answers: Sequence[str],
    questions: Sequence[str],
    neighbors: int,
    head_min_wordings: int | None,
    checked: bool,
    path: Sequence[OperatingPoint] = PATH,
    seed: int = 0,
) -> list[Trial]:
    """Each stored wording (at most `MAX_TRIALS`) asked of the scope without it, as a lookup would.

    Args:
        vectors, answers, questions: the scope's live entries, row for row (unit vectors).
        neighbors: the cache's `neighbors`.
        head_min_wordings: the cache's `head_min_wordings`; None when it uses no answer heads.
        checked: whether lookups run the verification checks.
    """
    count = len(answers)
    if count < 2:
        return [Trial(None, True) for _ in range(count)]
    rng = np.random.default_rng(seed)
    asked = np.sort(rng.permutation(count)[:MAX_TRIALS])
    group_of = near_copy_groups(vectors)
    groups = int(group_of.max()) + 1
    fold_of_group = np.empty(groups, dtype=np.int64)
    fold_of_group[rng.permutation(groups)] = np.arange(groups) % FOLDS
    fold_of = fold_of_group[group_of]
    heads = _cross_fitted_heads(vectors, answers, fold_of, head_min_wordings)
    trials = []
    for start in range(0, len(asked), _CHUNK):
        rows = asked[start : start + _CHUNK]
        similarities = vectors[rows] @ vectors.T
        similarities[group_of[rows][:, None] == group_of[None, :]] = -np.inf  # not itself, nor its near-copies
        for row, scores in zip(rows.tolist(), similarities):
            head = heads[fold_of[row]]
            found = nearest(scores, reach(neighbors, head))
            reading = read(found, answers.__getitem__, head, vectors[row], neighbors)
            trials.append(trial(reading, questions[row], questions.__getitem__, answers[row], checked, path))
    return trials


def nearest(similarities: np.ndarray, count: int) -> list[tuple[int, float]]:
    """The `count` rows most similar, most similar first, as (row, similarity); rows left out (-inf) never."""
    count = min(count, int(np.isfinite(similarities).sum()))
    if count == 0:
        return []
    top = np.argpartition(-similarities, count - 1)[:count]
    top = top[np.argsort(-similarities[top], kind="stable")]
    return [(int(j), float(similarities[j])) for j in top]


def trial(
    reading: Reading | None,
    asked: str,
    wording_of: Callable[[int], str],
    answer: str,
    checked: bool,
    path: Sequence[OperatingPoint] = PATH,
) -> Trial:
    """The first point serving `asked` (whose answer is `answer`) through a stored wording that passes verification.

    Args:
        reading: what `decision.read` found for it.
        wording_of: a stored entry's question text.
    """
    if reading is None:
        return Trial(None, True)
    similarity = next((s for j, s in reading.wordings if not checked or verify(asked, wording_of(j)).ok), None)
    wrong = reading.answer_key != answer
    if similarity is None:
        return Trial(None, wrong)
    rank = next((step for step, point in enumerate(path) if similarity >= point.threshold and reading.admits(point)), None)
    return Trial(rank, wrong)


def _cross_fitted_heads(
    vectors: np.ndarray, answers: Sequence[str], fold_of: np.ndarray, min_wordings: int | None
) -> list[AnswerHead | None]:
    """One head per fold, fitted on the other folds' entries."""
    if min_wordings is None or len(answers) < 2 * min_wordings:
        return [None] * FOLDS
    heads = []
    for fold in range(FOLDS):
        kept = np.flatnonzero(fold_of != fold)
        heads.append(fit_head(vectors[kept], [answers[int(i)] for i in kept], min_wordings))
    return heads


def near_copy_groups(vectors: np.ndarray, similarity: float = NEAR_COPY) -> np.ndarray:
    """Each row's group: the rows joined to it by chains of pairs at least `similarity` alike."""
    count = len(vectors)
    rows, columns = [], []
    for start in range(0, count, _CHUNK):
        block_rows, block_columns = np.nonzero(vectors[start : start + _CHUNK] @ vectors.T >= similarity)
        rows.append(block_rows + start)
        columns.append(block_columns)
    pairs = np.ones(sum(len(r) for r in rows), dtype=np.int8)
    graph = coo_matrix((pairs, (np.concatenate(rows), np.concatenate(columns))), shape=(count, count))
    return np.asarray(connected_components(graph, directed=False)[1], dtype=np.int64)

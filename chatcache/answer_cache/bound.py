"""How sure the cache can be that at most a share D of its answers served by meaning are wrong.

Why exact binomial (Clopper-Pearson) bounds: a trial is one question with a served answer that
is right or wrong, so the count of wrong ones among n served is binomial, and the exact bound is
the tightest that holds for every n (Hoeffding-Bentkus, which MAPIE uses, is never tighter).
`last_certified` is Learn-then-Test with fixed-sequence testing: the operating points are tested
from strict to loose in an order fixed in advance, each at the full level 1 - confidence, and
testing stops at the first that cannot be certified, so no multiplicity correction is needed.
A point that serves fewer than `min_evidence` trials is passed over rather than tested: which
points are passed over depends only on how many trials each serves, not on which served answers
are wrong, so the sequence tested is still fixed before the errors are seen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from scipy.stats import beta


def upper_bound(errors: int, served: int, confidence: float) -> float:
    """The one-sided upper confidence bound on the error rate after `errors` wrong of `served`."""
    if served <= 0 or errors >= served:
        return 1.0
    return float(beta.ppf(confidence, errors + 1, served - errors))


def lower_bound(errors: int, served: int, confidence: float) -> float:
    """The one-sided lower confidence bound on the error rate after `errors` wrong of `served`.

    Above a target, the error rate is over the target with probability `confidence`: the
    audits' evidence that a scope broke its bound (`audits.AuditLedger.breached`).
    """
    if served <= 0 or errors <= 0:
        return 0.0
    return float(beta.ppf(1.0 - confidence, errors, served - errors + 1))


def interval(errors: int, served: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided exact confidence interval on the error rate (both ends at (1 - confidence) / 2)."""
    if served <= 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2
    low = 0.0 if errors == 0 else float(beta.ppf(tail, errors, served - errors + 1))
    high = 1.0 if errors >= served else float(beta.ppf(1.0 - tail, errors + 1, served - errors))
    return low, high


@functools.cache
def min_evidence(max_error_rate: float, confidence: float) -> int:
    """How many served trials a point needs before it is tested: enough that wrong answers at half
    the bound would certify it (1,549, 773 and 386 for D = 0.005, 0.01 and 0.02 at 95%).

    Why not the least that could ever certify (598, 299 and 149: that many with no error at
    all): a point tested with barely enough trials fails on its first wrong answer and, tests
    being in a fixed sequence, ends the sequence there; on BANKING77's training file that left
    D = 0.005 with no point at all.
    """
    served = math.ceil(math.log(1.0 - confidence) / math.log(1.0 - max_error_rate))
    while upper_bound(math.floor(served * max_error_rate / 2), served, confidence) > max_error_rate:
        served += 1
    return served


def last_certified(
    served: Sequence[int], errors: Sequence[int], max_error_rate: float, confidence: float
) -> int | None:
    """The loosest point of a strict-to-loose sequence certified by fixed-sequence testing; None if none is.

    Args:
        served, errors: per point, how many trials it serves and how many of those are wrong.
    """
    needed = min_evidence(max_error_rate, confidence)
    chosen = None
    for step, (n, k) in enumerate(zip(served, errors)):
        if n < needed:
            continue
        if upper_bound(k, n, confidence) > max_error_rate:
            break
        chosen = step
    return chosen

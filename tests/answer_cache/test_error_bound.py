"""A user-set error bound: the cache serves by meaning only as far as its own stored wordings certify.

Vectors are placed by hand (`Space`, as in the answer-head tests), so each test controls what a
leave-one-out trial meets. Wordings are nonsense words, which verification passes, except where
a test is about verification.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.answer_cache.bound import interval, last_certified, min_evidence, upper_bound
from chatcache.answer_cache.calibration import calibrate, leave_one_out, near_copy_groups
from chatcache.answer_cache.decision import PATH
from chatcache.errors import ConfigError

from .test_answer_heads import DIM, Space, axis

BOT = Scope("model@1", "bot-a")
_SYLLABLES = ["zor", "blick", "mand", "quiv", "tesh", "plon", "grab", "vend", "losk", "frim", "dask", "yurn"]


def nonsense(rng: np.random.Generator, words: int = 5) -> str:
    return " ".join(
        "".join(rng.choice(_SYLLABLES, size=2)) + "".join(rng.choice(list("aeiou"), size=1)) for _ in range(words)
    )


def bounded_cache(space: Space, wordings: int, max_error_rate: float = 0.02, **config: object) -> AnswerCache:
    """A cache under a bound holding `wordings` nonsense wordings of answer A (first axis) and of B (second),
    spread so that few are near-copies of each other (near-copies are left out together in calibration)."""
    cache = AnswerCache(AnswerCacheConfig(max_error_rate=max_error_rate, **config), space.embed)  # type: ignore[arg-type]
    rng = np.random.default_rng(7)
    for answer, direction in (("Answer A.", axis(1)), ("Answer B.", axis(0, 1))):
        for _ in range(wordings):
            assert cache.store(space.place(nonsense(rng), direction, spread=0.3), answer, BOT, 1.0, 100)
    return cache


def test_the_evidence_a_bound_needs() -> None:
    assert [math.ceil(math.log(0.05) / math.log(1 - d)) for d in (0.005, 0.01, 0.02)] == [598, 299, 149]
    assert [min_evidence(d, 0.95) for d in (0.005, 0.01, 0.02)] == [1549, 773, 386]
    for d in (0.005, 0.01, 0.02):  # at that many trials, wrong answers at half the bound certify it
        n = min_evidence(d, 0.95)
        assert upper_bound(math.floor(n * d / 2), n, 0.95) <= d
    assert upper_bound(0, 299, 0.95) <= 0.01 < upper_bound(0, 298, 0.95)
    assert upper_bound(0, 500, 0.9) == pytest.approx(1 - 0.1 ** (1 / 500))
    low, high = interval(23, 2245)
    assert (round(low, 4), round(high, 4)) == (0.0065, 0.0153) and low < 23 / 2245 < high
    assert interval(0, 100)[0] == 0.0 and upper_bound(5, 5, 0.95) == 1.0


def test_the_sequence_stops_at_the_first_point_it_cannot_certify() -> None:
    served = [100, 2000, 3000, 4000, 5000]
    assert last_certified(served, [0, 2, 3, 30, 4], 0.01, 0.95) == 2  # the last point would pass: never reached
    assert last_certified(served, [99, 2, 3, 4, 5], 0.01, 0.95) == 4  # 100 trials are too few to be tested at all
    assert last_certified([800] * 3, [20] * 3, 0.01, 0.95) is None
    assert last_certified([], [], 0.01, 0.95) is None


def test_the_path_goes_from_strict_to_loose() -> None:
    assert all(later.no_stricter_than(earlier) for earlier, later in zip(PATH, PATH[1:]))
    assert PATH[0].threshold > PATH[-1].threshold


def test_a_scope_without_enough_evidence_serves_exact_repeats_only() -> None:
    space = Space()
    cache = bounded_cache(space, 40)
    cache.calibrate()
    stored = next(text for text in space.vectors)
    assert cache.lookup(stored, BOT) is not None
    paraphrase = space.place("a new wording of answer a", axis(1), spread=0.05)
    assert cache.lookup(paraphrase, BOT) is None
    stats = cache.snapshot()
    assert stats.refused_without_evidence == 1 and stats.scopes_exact_only == 1 and stats.scopes_by_meaning == 0


def test_a_scope_with_enough_evidence_serves_by_meaning_and_only_the_right_answer() -> None:
    """Against the uncached truth: questions placed in a cluster get its answer or nothing, and most get it."""
    space = Space()
    cache = bounded_cache(space, 400)
    cache.calibrate()
    assert cache.snapshot().scopes_by_meaning == 1
    served, rng = 0, np.random.default_rng(11)
    for i in range(60):
        truth, direction = ("Answer A.", axis(1)) if i % 2 else ("Answer B.", axis(0, 1))
        hit = cache.lookup(space.place(nonsense(rng), direction, spread=0.1), BOT)
        assert hit is None or hit.answer == truth
        served += hit is not None
    assert served >= 50


def test_a_scope_calibrates_itself_in_the_background() -> None:
    space = Space()
    cache = bounded_cache(space, 400)  # no calibrate(): the stores alone set it off
    question = space.place("another wording of answer b", axis(0, 1), spread=0.05)
    deadline = time.monotonic() + 120
    while cache.lookup(question, BOT) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    hit = cache.lookup(question, BOT)
    assert hit is not None and hit.answer == "Answer B."


def test_a_wording_no_other_wording_shares_the_answer_of_is_wrong_when_served() -> None:
    """Out of scope for the cache: whatever a question with no answer of its own is served is wrong."""
    rng = np.random.default_rng(3)
    vectors = [axis(1)] * 50 + [axis(0, 1)] * 50
    spread = [np.asarray(v) + 0.3 * rng.standard_normal(DIM) for v in vectors]
    unit = np.stack([*spread, np.asarray(axis(1, 0.5))]).astype(np.float32)  # lonely: near a, a near-copy of none
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    answers = ["a"] * 50 + ["b"] * 50 + ["lonely"]
    trials = leave_one_out(unit, answers, [nonsense(rng) for _ in answers], 10, 5, checked=True)
    assert trials[-1].wrong and trials[-1].rank is not None  # it would be served "a": an error
    assert calibrate(trials, 0.02, 0.95).point is None  # 100 trials are too few for 2%


@pytest.mark.parametrize(
    ("stored", "asked", "reason"),
    [
        ("I want to block my card", "I don't want to block my card", "negation"),
        ("send 50 dollars to my savings", "send 500 dollars to my savings", "numbers"),
        ("is the branch in Paris open on sunday", "is the branch in Berlin open on sunday", "entity"),
    ],
)
def test_verification_refuses_under_a_bound_what_it_refuses_without(stored: str, asked: str, reason: str) -> None:
    space = Space()
    cache = bounded_cache(space, 400)
    assert cache.store(space.place(stored, axis(0, 0, 1)), "The stored answer.", BOT, 1.0, 100)
    cache.calibrate()
    assert cache.snapshot().scopes_by_meaning == 1
    assert cache.lookup(space.place(asked, axis(0, 0, 1)), BOT) is None
    assert reason in " ".join(cache.snapshot().refusal_reasons)
    assert cache.lookup(stored, BOT) is not None


def test_another_users_particulars_are_refused_under_a_bound() -> None:
    space = Space()
    cache = bounded_cache(space, 400)
    stored = space.place("write a sick note for Jane Doe", axis(0, 0, 1))
    assert cache.store(stored, "Dear team, Jane Doe is ill today.", BOT, 1.0, 100)
    cache.calibrate()
    asked = space.place("could you write a sick note", axis(0, 0, 1))
    assert cache.lookup(asked, BOT, across_users=True) is None
    assert cache.lookup(asked, BOT) is not None  # the same question in this user's own scope is served


@pytest.mark.parametrize("config", [{"max_error_rate": 0.0}, {"max_error_rate": 0.5}, {"bound_confidence": 1.0}])
def test_bound_settings_are_checked(config: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        AnswerCacheConfig(**config)  # type: ignore[arg-type]


def test_a_scope_whose_audits_breach_the_bound_falls_back_to_exact_repeats() -> None:
    space = Space()
    cache = bounded_cache(space, 400)
    cache.calibrate()
    rng = np.random.default_rng(5)
    asked = [space.place(nonsense(rng), axis(1), spread=0.05) for _ in range(4)]
    hit = cache.lookup(asked[0], BOT)
    assert hit is not None
    for _ in range(3):  # the model answered otherwise three times out of three: above 2%, 95% sure
        cache.record_audit(hit, agreed=False)
    assert all(cache.lookup(question, BOT) is None for question in asked[1:])
    assert cache.lookup(hit.question, BOT) is not None  # an exact repeat is the same question


def test_a_wordings_near_copies_are_left_out_with_it() -> None:
    """A trial is judged as a question with no near-copy stored: its twin cannot vouch for it."""
    rng = np.random.default_rng(4)
    twins = [np.asarray(axis(0, 0, 1)), np.asarray(axis(0, 0, 1, 0.05))]
    others = [np.asarray(axis(0, 1)) + 0.3 * rng.standard_normal(DIM) for _ in range(50)]
    unit = np.stack([*twins, *others]).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    groups = near_copy_groups(unit)
    assert groups[0] == groups[1] and groups[0] not in set(groups[2:].tolist())
    trials = leave_one_out(unit, ["a", "a"] + ["b"] * 50, [nonsense(rng) for _ in range(52)], 10, 5, checked=True)
    assert trials[0].wrong and trials[1].wrong  # left without its twin, each finds only answer b

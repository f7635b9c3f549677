"""A scope's answer head chooses between answers with many wordings, and reaches no further than the vote.

The texts here are names for vectors placed by hand (a cluster of wordings per answer in an
8-dimensional space), so each test controls exactly what the neighbours and the head see.
Verification is off: it judges words, and these words mean nothing (it is tested elsewhere).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope, normalize
from chatcache.answer_cache.heads import fit_head
from chatcache.answer_cache.scope_models import ScopeModels, ScopeRows
from chatcache.errors import ConfigError

BOT = Scope("model@1", "bot-a")
DIM = 8


class Space:
    """Texts to hand-placed unit vectors: `place` names a point, the cache's embedder reads it back."""

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(0)

    def place(self, text: str, direction: list[float], spread: float = 0.0) -> str:
        vector = np.asarray(direction, dtype=np.float64) + spread * self.rng.standard_normal(DIM)
        self.vectors[normalize(text)] = (vector / np.linalg.norm(vector)).astype(np.float32)
        return text

    def cluster(self, name: str, direction: list[float], count: int) -> list[str]:
        return [self.place(f"{name} wording {i}", direction, spread=0.15) for i in range(count)]

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[normalize(text)] for text in texts])


def axis(*weights: float) -> list[float]:
    return [*weights, *([0.0] * (DIM - len(weights)))]


def filled(space: Space, **config: object) -> AnswerCache:
    """A cache holding 20 wordings of answer A (along the first axis) and 20 of B (the second)."""
    answers = AnswerCache(AnswerCacheConfig(verify=False, **config), space.embed)  # type: ignore[arg-type]
    for answer, direction in (("Answer A.", axis(1)), ("Answer B.", axis(0, 1))):
        for text in space.cluster(answer, direction, 20):
            assert answers.store(text, answer, BOT, 1.0, 100)
    answers.calibrate()
    return answers


def test_a_head_serves_the_answer_a_stray_wording_made_ambiguous_to_the_vote() -> None:
    """One wording of B that sits inside A's cluster (a mislabelled question) makes the vote
    refuse every question near it; the head, trained on all 40 wordings, still knows it is A."""
    for confidence in (None, 0.8):
        space = Space()  # the same places for both caches
        question = space.place("a question about A", axis(1, 0.1, 0.05))
        answers = filled(space, head_confidence=confidence)
        answers.store(space.place("a stray wording of B", axis(1, 0.12, -0.05, 0.05)), "Answer B.", BOT, 1.0, 100)
        answers.calibrate()
        hit = answers.lookup(question, BOT)
        if confidence is not None:
            assert hit is not None and hit.answer == "Answer A."
        else:
            assert hit is None and answers.snapshot().refused_as_ambiguous == 1


def test_a_head_that_is_not_sure_refuses() -> None:
    space = Space()
    answers = filled(space, similarity_threshold=0.3)
    between = space.place("between A and B", axis(1, 1))
    assert answers.lookup(between, BOT) is None
    assert answers.snapshot().refused_by_head == 1
    near_b = answers.lookup(space.place("a question about B", axis(0.1, 1)), BOT)
    assert near_b is not None and near_b.answer == "Answer B."


def test_a_head_reaches_no_further_than_the_similarity_threshold() -> None:
    """Far along A's side of the border, but like no stored wording: the head is sure, nothing is served."""
    space = Space()
    answers = filled(space)
    far = space.place("a far question", axis(0.6, 0, 0, 0, 0, 0, 0, 1))
    assert float(np.max(space.embed([t for t in space.vectors if "wording" in t]) @ space.embed([far])[0])) < 0.75
    assert answers.lookup(far, BOT) is None
    assert answers.snapshot().refused_by_head == 0


def test_an_answer_stored_after_the_fit_is_left_to_the_vote() -> None:
    """The head never saw C: a question whose nearest wording is C's is not judged between A and B."""
    space = Space()
    answers = filled(space)
    for text in space.cluster("Answer C.", axis(0, 0, 1), 2):  # 2 of 40: under a tenth, so no refit
        answers.store(text, "Answer C.", BOT, 1.0, 100)
    hit = answers.lookup(space.place("a question about C", axis(0.05, 0, 1)), BOT)
    assert hit is not None and hit.answer == "Answer C."


def test_the_served_answer_is_the_nearest_answer_wherever_the_vote_was_clear() -> None:
    """Against the uncached truth: every question placed near one answer's cluster gets that answer or nothing."""
    space = Space()
    answers = filled(space)
    for i in range(40):
        truth, direction = ("Answer A.", axis(1)) if i % 2 else ("Answer B.", axis(0, 1))
        hit = answers.lookup(space.place(f"question {i}", direction, spread=0.2), BOT)
        assert hit is None or hit.answer == truth


def test_heads_follow_their_scope_in_a_background_thread() -> None:
    """A scope that grows by a tenth is refitted off the storing thread; a scope that empties loses its head."""
    space = Space()
    rows: dict[str, tuple[list[np.ndarray], list[str]]] = {"s": ([], [])}
    lock = threading.Lock()
    fitted_on: list[int] = []  # the threads fits ran on

    def snapshot(key: str) -> ScopeRows:
        fitted_on.append(threading.get_ident())  # a fit starts by reading its scope's rows, here
        with lock:
            vectors, labels = rows[key]
            return ScopeRows(np.stack(vectors), list(labels), [f"q{i}" for i in range(len(labels))])

    def add(answer: str, direction: list[float], count: int) -> None:
        with lock:
            for text in space.cluster(f"{answer} {len(rows['s'][1])}", direction, count):
                rows["s"][0].append(space.embed([text])[0])
                rows["s"][1].append(answer)

    heads = ScopeModels(snapshot, head_min_wordings=5, bound=None, neighbors=10, checked=True, min_entries=10)
    add("a", axis(1), 10)
    add("b", axis(0, 1), 10)
    caller = threading.get_ident()
    heads.changed("s", 20)
    deadline = time.monotonic() + 30
    while heads.head("s") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    first = heads.head("s")
    assert first is not None and first.known == {"a", "b"} and fitted_on and caller not in fitted_on
    add("c", axis(0, 0, 1), 1)
    heads.changed("s", 21)  # a twentieth: the head stays as it is
    heads.fit_now([])
    assert heads.head("s") is first
    add("c", axis(0, 0, 1), 5)
    heads.changed("s", 26)
    heads.fit_now([])  # waits for the background fit
    refitted = heads.head("s")
    assert refitted is not None and "c" in refitted.classes
    heads.changed("s", 3)
    assert heads.head("s") is None


def test_a_head_needs_two_answers_with_enough_wordings() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((12, DIM)).astype(np.float32)
    assert fit_head(vectors, ["a"] * 8 + ["b"] * 4, min_wordings=5) is None
    head = fit_head(vectors, ["a"] * 6 + ["b"] * 5 + ["c"], min_wordings=5)
    assert head is not None and set(head.classes) == {"a", "b", ""} and head.known == {"a", "b", "c"}


@pytest.mark.parametrize("config", [{"head_confidence": 0.0}, {"head_confidence": 1.5}, {"head_min_wordings": 1}])
def test_head_settings_are_checked(config: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        AnswerCacheConfig(**config)  # type: ignore[arg-type]

"""ACPC prefetch: learn which question tends to follow which, and answer it before it is asked.

A Markov model counts transitions between consecutive user turns of every conversation in the
session tier (a turn's state is its confirmed intent when the bot has one, else its normalised
text). After a reply, the likely next questions are queued; a background thread answers them
into the answer cache, under the scope the next turn will have, marked as prefetched. It runs
only while no user turn is in progress and stops between two tokens when one arrives: a
prefetch never delays a user.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..worker_threads import close_at_exit
from .keys import normalize

log = logging.getLogger("chatcache")

# (session_id, question, should_stop) -> whether an answer was stored
Answer = Callable[[str, str, Callable[[], bool]], bool]


@dataclass(frozen=True)
class Prediction:
    question: str
    probability: float


class TransitionModel:
    """First-order Markov model over turn states, with a representative question per state."""

    def __init__(self, min_count: int = 2, min_probability: float = 0.3) -> None:
        self.min_count = min_count
        self.min_probability = min_probability
        self._next: dict[str, Counter[str]] = defaultdict(Counter)
        self._questions: dict[str, Counter[str]] = defaultdict(Counter)
        self._lock = threading.Lock()

    @staticmethod
    def state(question: str, intent: str | None) -> str:
        return f"intent:{intent}" if intent and intent != "out_of_scope" else f"text:{normalize(question)}"

    def learn(self, turns: Iterable[tuple[str, str | None]]) -> None:
        """Count one conversation's consecutive (question, intent) user turns."""
        previous = None
        with self._lock:
            for question, intent in turns:
                current = self.state(question, intent)
                self._questions[current][question] += 1
                if previous is not None:
                    self._next[previous][current] += 1
                previous = current

    def predict(self, question: str, intent: str | None, limit: int = 2) -> list[Prediction]:
        """The most likely next questions, each seen often enough and likely enough."""
        with self._lock:
            following = self._next.get(self.state(question, intent))
            if not following:
                return []
            total = sum(following.values())
            predictions = []
            for state, count in following.most_common(limit):
                probability = count / total
                if count >= self.min_count and probability >= self.min_probability:
                    representative = self._questions[state].most_common(1)[0][0]
                    predictions.append(Prediction(representative, probability))
            return predictions


class Prefetcher:
    """Background answering of predicted next questions while the engine is idle."""

    def __init__(self, model: TransitionModel, answer: Answer, is_busy: Callable[[], bool], idle_wait_s: float = 0.2) -> None:
        self.model = model
        self._answer = answer
        self._is_busy = is_busy
        self._idle_wait_s = idle_wait_s
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._stop = threading.Event()
        self.completed = 0
        self.cancelled = 0
        self._thread = threading.Thread(target=self._run, name="chatcache-prefetch", daemon=True)
        self._thread.start()
        close_at_exit(self)

    def after_turn(self, session_id: str, history: list[tuple[str, str | None]]) -> None:
        """Learn from the session's latest transition and queue what probably comes next."""
        if len(history) >= 2:
            self.model.learn(history[-2:])
        if history:
            question, intent = history[-1]
            for prediction in self.model.predict(question, intent):
                self._queue.put((session_id, prediction.question))

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get()
            if item is None:
                return
            while self._is_busy() and not self._stop.is_set():
                self._stop.wait(self._idle_wait_s)
            session_id, question = item
            try:
                if self._answer(session_id, question, lambda: self._is_busy() or self._stop.is_set()):
                    self.completed += 1
                else:
                    self.cancelled += 1
            except Exception:  # noqa: BLE001 - a failed prefetch must never reach a user
                log.exception("prefetch of %r failed", question)
                self.cancelled += 1
            finally:
                self._queue.task_done()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until the queue is drained (for tests and benchmarks)."""
        done = threading.Event()

        def drain() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        return done.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=5)

"""Detect topic drift in a conversation from its user turns.

A drift means "the user started a new task": the engine then stops feeding the old topic's
history to the model. A false drift makes the bot forget what the user just said, so the
detector is built for precision. It combines signals that each fail alone:

- Low-information turns ("Yes, book it.", "Thanks!", "7 pm") look unrelated to everything
  in embedding space but continue the topic, so they never drift and leave the state alone.
- Novelty: the new turn must be far from the previous user turn, the assistant's last turn
  and the centroid of the topic so far (the best of the three).
- Evidence of a new domain: the turn is closer to another domain prototype than to the
  topic's, the dialogue state machine's `domain_hint` changed, or a language model says the
  history barely helps to predict the turn (`history_gain`). Novelty alone is not enough.

`SeedRule` keeps the original rule (cosine jumps on consecutive turns, or a drop against
the sliding-window mean) as the baseline the combined detector is measured against.

The detector does not load models: callers pass unit-norm embeddings and, optionally,
domain prototypes as a dict of name -> unit vector.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError

# Words that carry no topic: acknowledgements, politeness, yes/no and function words.
_FILLER = frozenset(
    """
    a about again all also am an and any anything are as at be bye can cool correct could did do
    does done else fine for get go good goodbye great have hello help hey hi how i i'd i'll i'm
    is it it's just like linda lot many me more much my need no nope not nothing now of ok okay
    on one or perfect please really right sounds so sure thank thanks that that's the them then
    there this to too understood want was we what when where which will with would wonderful
    yeah yep yes you your
    """.split()
)
_WORD = re.compile(r"[a-z][a-z']*")
_CLAUSE = re.compile(r"[.,!?;:]")


@dataclass
class DriftConfig:
    """Thresholds of the combined detector and of the seed rule.

    Args:
        min_content_words: a turn with fewer words outside `_FILLER` is low-information.
        novelty: the turn drifts only if 1 - max(similarity to previous user turn, last
            assistant turn, topic centroid) exceeds this.
        domain_margin: how much closer the turn must be to another domain prototype than to
            the topic's domain to count as domain evidence.
        min_domain_similarity: the other prototype must be at least this similar to the turn.
        topic_window: how many informative user turns form the topic centroid.
        history_gain: a `history_gain` below this counts as evidence of a new topic.
        seed_ratio: seed rule, r_t = 1 - cos(v_t, v_{t-1}) must exceed this ...
        seed_cos: ... and cos must be below this, on `seed_consecutive` turns in a row.
        seed_consecutive: consecutive far turns the seed rule needs.
        seed_window: turns in the seed rule's sliding window.
        seed_window_drop: seed rule also fires when similarity to the window mean falls
            more than this fraction below the window's own mean similarity.
    """

    min_content_words: int = 2
    novelty: float = 0.5
    domain_margin: float = 0.15
    min_domain_similarity: float = 0.4
    topic_window: int = 4
    history_gain: float = 0.1
    seed_ratio: float = 0.12
    seed_cos: float = 0.85
    seed_consecutive: int = 2
    seed_window: int = 5
    seed_window_drop: float = 0.18

    def __post_init__(self) -> None:
        for name in ("novelty", "domain_margin", "seed_ratio", "seed_window_drop"):
            value = getattr(self, name)
            if not 0.0 <= value <= 2.0:
                raise ConfigError(f"DriftConfig.{name} must be in [0, 2], got {value}")
        for name in ("min_domain_similarity", "seed_cos"):
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise ConfigError(f"DriftConfig.{name} must be in [-1, 1], got {value}")
        for name in ("topic_window", "seed_consecutive", "seed_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DriftConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.min_content_words < 0:
            raise ConfigError(f"DriftConfig.min_content_words must be >= 0, got {self.min_content_words}")


@dataclass(frozen=True)
class DriftResult:
    """One turn's verdict: `score` is the novelty (0 = same as context), `reasons` why."""

    drift: bool
    score: float
    reasons: list[str] = field(default_factory=list)


def is_low_information(text: str, min_content_words: int) -> bool:
    """True for turns that carry no topic of their own: acks, yes/no, thanks, bare numbers."""
    content = [w for w in _WORD.findall(text.lower()) if w not in _FILLER]
    return len(content) < min_content_words


def opens_with_acknowledgement(text: str, min_content_words: int) -> bool:
    """True for "Thanks, that works. Now ..." turns: the user first closes the old task."""
    first = _CLAUSE.split(text.strip(), maxsplit=1)[0]
    return first != text.strip() and is_low_information(first, min_content_words)


@dataclass
class _Topic:
    """What one session's current topic looks like."""

    window: deque[np.ndarray]
    last_user: np.ndarray | None = None
    last_assistant: np.ndarray | None = None
    last_hint: str | None = None


class DriftDetector:
    """Per-session drift detection from user-turn embeddings and optional external signals.

    Args:
        config: thresholds.
        prototypes: domain name -> unit vector; without them only `domain_hint` and
            `history_gain` can supply the domain evidence a drift needs.
    """

    def __init__(self, config: DriftConfig | None = None, prototypes: dict[str, np.ndarray] | None = None) -> None:
        self.config = config or DriftConfig()
        self._names = list(prototypes or {})
        self._protos = np.stack([prototypes[n] for n in self._names]) if prototypes else None
        self._topics: dict[str, _Topic] = {}

    def observe(
        self,
        session_id: str,
        user_embedding: np.ndarray,
        text: str,
        assistant_embedding: np.ndarray | None = None,
        domain_hint: str | None = None,
        history_gain: float | None = None,
    ) -> DriftResult:
        """Judge one user turn and fold it into the session's topic.

        Args:
            session_id: the conversation.
            user_embedding: unit-norm embedding of the new user turn.
            text: the user turn, used to spot low-information turns.
            assistant_embedding: unit-norm embedding of the assistant's last turn, if any.
            domain_hint: the dialogue state machine's current domain or intent, if known.
            history_gain: how much the history lowers an LM's loss on this turn, if known.

        Returns:
            Whether the turn starts a new topic, its novelty score and the reasons.
        """
        cfg = self.config
        topic = self._topics.setdefault(session_id, _Topic(deque(maxlen=cfg.topic_window)))
        hint_changed = domain_hint is not None and topic.last_hint not in (None, domain_hint)
        if domain_hint is not None:
            topic.last_hint = domain_hint
        if is_low_information(text, cfg.min_content_words):
            return DriftResult(False, 0.0, ["low_information"])
        if topic.last_user is None:
            self._start_topic(topic, user_embedding)
            return DriftResult(False, 0.0, ["first_turn"])

        centroid = np.mean(topic.window, axis=0)
        references = [topic.last_user, centroid]
        if assistant_embedding is not None:
            references.append(assistant_embedding)
        elif topic.last_assistant is not None:
            references.append(topic.last_assistant)
        novelty = 1.0 - max(_cos(user_embedding, r) for r in references)

        evidence = []
        shift = self._domain_shift(user_embedding, centroid)
        if shift is not None:
            evidence.append(f"domain:{shift[0]}->{shift[1]}")
        if hint_changed:
            evidence.append(f"hint:{domain_hint}")
        if history_gain is not None and history_gain < cfg.history_gain:
            evidence.append("low_history_gain")
        shifted = novelty > cfg.novelty and bool(evidence)
        # A hand-over turn ("Great, thanks. Can you also get me a cab there?") still answers
        # the old task and often points into it ("there"): keep the history, move the topic.
        handover = shifted and opens_with_acknowledgement(text, cfg.min_content_words)
        drift = shifted and not handover
        if shifted:
            self._start_topic(topic, user_embedding)
            if handover:
                evidence.append("handover")
        else:
            topic.window.append(user_embedding)
            topic.last_user = user_embedding
        if assistant_embedding is not None:
            topic.last_assistant = assistant_embedding
        return DriftResult(drift, float(novelty), [f"novelty:{novelty:.2f}", *evidence])

    def reset(self, session_id: str) -> None:
        """Forget a session's topic (after it ends, or when the user asks to start over)."""
        self._topics.pop(session_id, None)

    def _domain_shift(self, embedding: np.ndarray, centroid: np.ndarray) -> tuple[str, str] | None:
        """(topic domain, new domain) when the turn is clearly closer to another prototype."""
        if self._protos is None:
            return None
        sims = self._protos @ embedding
        best = int(np.argmax(sims))
        # The topic's domain comes from the centroid, so one odd turn cannot relabel it.
        current = int(np.argmax(self._protos @ centroid))
        if best == current or sims[best] < self.config.min_domain_similarity:
            return None
        if sims[best] - sims[current] < self.config.domain_margin:
            return None
        return self._names[current], self._names[best]

    @staticmethod
    def _start_topic(topic: _Topic, embedding: np.ndarray) -> None:
        topic.window.clear()
        topic.window.append(embedding)
        topic.last_user = embedding


class SeedRule:
    """The original rule, kept as the baseline: it fires on short task turns (low precision)."""

    def __init__(self, config: DriftConfig | None = None) -> None:
        self.config = config or DriftConfig()
        self._prev: dict[str, np.ndarray] = {}
        self._far: dict[str, int] = {}
        self._window: dict[str, deque[np.ndarray]] = {}

    def observe(self, session_id: str, user_embedding: np.ndarray) -> DriftResult:
        """Judge one user turn: two consecutive far turns, or a drop against the window."""
        cfg = self.config
        window = self._window.setdefault(session_id, deque(maxlen=cfg.seed_window))
        prev = self._prev.get(session_id)
        self._prev[session_id] = user_embedding
        if prev is None:
            window.append(user_embedding)
            return DriftResult(False, 0.0, ["first_turn"])
        cos = _cos(user_embedding, prev)
        far = 1.0 - cos > cfg.seed_ratio and cos < cfg.seed_cos
        self._far[session_id] = self._far.get(session_id, 0) + 1 if far else 0
        reasons = []
        if self._far[session_id] >= cfg.seed_consecutive:
            reasons.append("consecutive_far")
        if len(window) >= 2:
            mean = np.mean(window, axis=0)
            baseline = float(np.mean([_cos(v, mean) for v in window]))
            if _cos(user_embedding, mean) < baseline * (1.0 - cfg.seed_window_drop):
                reasons.append("window_drop")
        window.append(user_embedding)
        if reasons:
            self._far[session_id] = 0
            window.clear()
            window.append(user_embedding)
        return DriftResult(bool(reasons), 1.0 - cos, reasons)

    def reset(self, session_id: str) -> None:
        """Forget a session."""
        for state in (self._prev, self._far, self._window):
            state.pop(session_id, None)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / denom if denom else 0.0

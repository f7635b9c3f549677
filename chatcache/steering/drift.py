"""Detect topic drift in a conversation from its user turns.

A drift means "the user started a new task": the engine then stops feeding the old topic's
history to the model. A false drift makes the bot forget what the user just said, so the
detector is built for precision. It combines signals that each fail alone:

- Where the task stands. Users start a new task once the old one is closed: the assistant
  reported success ("Your table is booked.") or asked whether there is anything else. While
  a task is open (the assistant just offered a result or asked a question), a turn that
  looks new usually still belongs to it ("Sounds good. Is it pet friendly?"), and the old
  task's history is what the next turns refer back to. So an open task needs a far larger
  jump than a closed one. On SGD dev, all 518 labelled switches follow an assistant turn
  that completed a task or asked for more.
- How the user answers a finished task. After "Your table is booked." (not "Anything
  else?"), a turn that thanks for it ("Thanks! Can you get me a cab there?") still closes
  the old task in the same breath and usually points into it ("there", "that day"), and a
  bare question ("What's their address?") asks about its result: both keep the history.
  Once the assistant has asked for more, the old task was closed by the user's previous
  turn, and the next request is new.
- Low-information turns ("Yes, book it.", "Thanks!", "7 pm") look unrelated to everything
  in embedding space but continue the topic, so they never drift and leave the state alone.
- Novelty: the new turn must be far from the previous user turn, the assistant's last turn
  and the centroid of the topic so far (the best of the three).
- Evidence of a new domain: the turn is closer to another domain prototype than to the
  topic's, or the dialogue state machine's `domain_hint` changed. Novelty alone is not enough.

These signals make the hand-built rule below (thresholds per stage, then the follow-up
exceptions). By default a learned model decides instead (`DriftConfig.model`, drift_model.py):
a logistic regression fitted on SGD's labelled task switches over the same signals and the
rule's own verdict (`TurnReading.features`), so that how much each signal counts is measured
rather than tuned by hand. Low-information and first turns never reach it.

`SeedRule` keeps the original rule (cosine jumps on consecutive turns, or a drop against
the sliding-window mean) as the baseline the combined detector is measured against.

The detector does not load models: callers pass unit-norm embeddings (or, to resume a
session in a new process, an embedding function) and, optionally, domain prototypes as a
dict of name -> unit vector. The word lists below are English.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .drift_model import SHIPPED_MODEL, load_model

# Words that carry no topic: acknowledgements, politeness, yes/no and function words.
_FILLER = frozenset(
    """
    a about again all also am an and any anything are as at be bye can cool correct could did do
    does done else fine for get go good goodbye great have hello help hey hi how i i'd i'll i'm
    is it it's just like linda lot many me more much my need no nope not nothing now of ok okay
    on one or perfect please pm really right sounds so sure thank thanks that that's the them then
    there this to too understood want was we what when where which will with would wonderful
    yeah yep yes you your
    """.split()
)
_WORD = re.compile(r"[a-z][a-z']*")
_CLAUSE = re.compile(r"[.,!?;:]")
# "Anything else?", "Can I help you with something else?", "How else may I help you?"
# ("Music, sports or anything else?" lists options: the task is still open.)
_ASKS_FOR_MORE = re.compile(
    r"(?<!\bor )\b(anything|something|what) ?else\b|\banyt\w* else\b|\b(how|what) else\b|\bwhat more\b"
    r"|\b(further|more|other|additional) (help|assistance)\b|\bfurther (assist|help)\b|\bhelp from me\b"
    r"|\b(assist|help|serve) you (out )?(some |any )?(more|further)\b|\b(need|want) help with anything\b"
    r"|\bwhat can i (help|do)\b|\bhelp with (anything|now)\b|\banything (more|additional)\b|\bhelp you again\b"
    r"|\bstill (help|need|assist)\b|(?<!\bor )\bany other (way|help|request)\b",
    re.IGNORECASE,
)
# "Your table is booked.", "The transfer went through.", "You're all set.", "You're welcome."
# ("A film you might enjoy" is an offer: the task is still open.)
_REPORTS_DONE = re.compile(
    r"\b(booked|reserved|confirmed|success(ful(ly)?)?|completed?|done|made|created|initiated|ordered|started"
    r"|coming|placed|scheduled|purchased|bought|transferred|requested|rented|on (its|the|their) way|on it'?s way"
    r"|all set|is set|been set|been \w+ed|(been|was|were) sent|(gone|went) (through|thru)"
    r"|(is|are) (now )?(fixed|ready|processing)|(you'?re|you are) (all )?set|added|set (it )?up|here soon"
    r"|(headed|heading) your way|(have|got) (the |your )?tickets"
    r"|able to (confirm|book|complete|reserve|rent|purchase)|playing (for you )?now|now playing"
    r"|(?<!might )(?<!may )(?<!would )enjoy|(you'?re|you are) (very )?welcome)\b",
    re.IGNORECASE,
)
# "Please confirm: a table for 2 is booked at 7 pm?" is a question about an open task.
_ASKS_BACK = re.compile(r"\?|\b(confirm|ensure|correct|right)\b", re.IGNORECASE)
_THANKS = re.compile(r"\bthank|\bappreciat|\bgrateful", re.IGNORECASE)
# Words that ask for something to be found or done; a question without them asks about a result.
_REQUESTS = re.compile(
    r"\b(find|get|book|reserve|search|look|need|want|like|rent|buy|purchase|play|help|also|too|as well|now"
    r"|another|other|else)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class StageThresholds:
    """How different a user turn must be to start a new topic, at one stage of a task.

    Args:
        min_content_words: a turn with fewer words outside `_FILLER` is low-information.
        novelty: 1 - max(similarity to previous user turn, last assistant turn, topic
            centroid) must exceed this.
        domain_margin: how much closer the turn must be to another domain prototype than to
            the topic's domain to count as domain evidence.
    """

    min_content_words: int
    novelty: float
    domain_margin: float

    def __post_init__(self) -> None:
        if self.min_content_words < 0:
            raise ConfigError(f"min_content_words must be >= 0, got {self.min_content_words}")
        for name in ("novelty", "domain_margin"):
            value = getattr(self, name)
            if not 0.0 <= value <= 2.0:
                raise ConfigError(f"{name} must be in [0, 2], got {value}")


@dataclass
class DriftConfig:
    """The learned model that decides drift, and the thresholds of the rule and the seed rule.

    The rule's thresholds were tuned on the even dialogues of SGD dev and checked on the odd
    ones (bench/README.md). The rule's verdict is one of the learned model's features, read
    with these thresholds: the shipped model was fitted with the defaults, so change them
    together with a refit, or with `model=None`.

    Args:
        model: the learned model's file (`chatcache eval drift --fit` writes one); None
            decides by the hand-built rule alone. The shipped model reads the bundled
            MiniLM's vectors: an engine with another embedder decides by the rule.
        open_task: thresholds while the assistant's last turn left the task open.
        closed_task: thresholds right after the assistant closed a task (reported success
            or asked whether there is anything else).
        min_domain_similarity: the other prototype must be at least this similar to the turn.
        topic_window: how many informative user turns form the topic centroid.
        return_margin: the first informative turn after a drift undoes it when it is closer
            to a dropped user turn than to every turn since by this much (`returns_to_dropped`).
        seed_ratio: seed rule, r_t = 1 - cos(v_t, v_{t-1}) must exceed this ...
        seed_cos: ... and cos must be below this, on `seed_consecutive` turns in a row.
        seed_consecutive: consecutive far turns the seed rule needs.
        seed_window: turns in the seed rule's sliding window.
        seed_window_drop: seed rule also fires when similarity to the window mean falls
            more than this fraction below the window's own mean similarity.
    """

    open_task: StageThresholds = StageThresholds(min_content_words=2, novelty=0.85, domain_margin=0.3)
    closed_task: StageThresholds = StageThresholds(min_content_words=1, novelty=0.3, domain_margin=0.15)
    min_domain_similarity: float = 0.3
    topic_window: int = 4
    return_margin: float = 0.2
    seed_ratio: float = 0.12
    seed_cos: float = 0.85
    seed_consecutive: int = 2
    seed_window: int = 5
    seed_window_drop: float = 0.18
    model: Path | None = SHIPPED_MODEL

    def __post_init__(self) -> None:
        for name in ("open_task", "closed_task"):
            if not isinstance(getattr(self, name), StageThresholds):
                raise ConfigError(f"DriftConfig.{name} must be a StageThresholds, got {getattr(self, name)!r}")
        for name in ("seed_ratio", "seed_window_drop", "return_margin"):
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


@dataclass(frozen=True)
class DriftResult:
    """One turn's verdict: `score` is the novelty (0 = same as context), `reasons` why."""

    drift: bool
    score: float
    reasons: list[str] = field(default_factory=list)


def is_low_information(text: str, min_content_words: int) -> bool:
    """True for turns that carry no topic of their own: acks, yes/no, thanks, bare numbers."""
    return _content_words(text) < min_content_words


def _content_words(text: str) -> int:
    return sum(w not in _FILLER for w in _WORD.findall(text.lower()))


def opens_with_acknowledgement(text: str, min_content_words: int) -> bool:
    """True for "Thanks, that works. Now ..." turns: the user first answers the open task."""
    first = _CLAUSE.split(text.strip(), maxsplit=1)[0]
    return first != text.strip() and is_low_information(first, min_content_words)


def asks_for_more(assistant_text: str) -> bool:
    """True when the assistant invites a new request ("Anything else I can help with?")."""
    return bool(_ASKS_FOR_MORE.search(assistant_text))


def closes_task(assistant_text: str) -> bool:
    """True when the assistant's turn ends a task: it asks for more, or reports it done."""
    if asks_for_more(assistant_text):
        return True
    return bool(_REPORTS_DONE.search(assistant_text)) and not _ASKS_BACK.search(assistant_text)


def follows_up_done_task(text: str) -> str | None:
    """Why a user turn right after a task was reported done still belongs to it, if it does.

    "thanks_done_task" for "Thanks! Can you get me a cab there?" (on SGD dev about 85% of such
    turns are annotated as still in the old task), "asks_about_result" for a question that
    asks for nothing new ("How long is the ride?", "What's their address?").
    """
    if _THANKS.search(text):
        return "thanks_done_task"
    if text.rstrip().endswith("?") and not _REQUESTS.search(text):
        return "asks_about_result"
    return None


def returns_to_dropped(turn: np.ndarray, dropped: np.ndarray, since: np.ndarray, margin: float) -> bool:
    """Whether the first informative user turn after a drift reset is about the topic it dropped
    ("And on Sunday?" after "Send 200 dollars" cut "What are your hours on Saturday?"): closer to
    one of the dropped user turns than to every user turn since the reset, by `margin` (rows of
    unit vectors). A false reset then costs one turn of a shorter prompt, not the conversation.
    """
    if len(dropped) == 0 or len(since) == 0:
        return False
    return float((dropped @ turn).max()) > float((since @ turn).max()) + margin


@dataclass
class DriftTopic:
    """What one session's current topic looks like to the detector.

    The session's memory holds it (`SessionMemory`), not the detector: a session let go of
    takes its topic with it, and the next turn resumes one from the stored turns (`resume`).
    """

    window: deque[np.ndarray]
    last_user: np.ndarray | None = None
    last_assistant: np.ndarray | None = None
    last_hint: str | None = None


FEATURES = (
    "closed",
    "invited",
    "novelty",
    "cos_last_user",
    "cos_topic",
    "cos_assistant",
    "domain_margin",
    "domain_similarity",
    "domain_evidence",
    "hint_changed",
    "acknowledges",
    "thanks",
    "asks_about_result",
    "content_words",
    "question",
    "topic_turns",
    "rule_drift",
    "closed_x_novelty",
    "closed_x_domain_margin",
)
"""The learned model's inputs, in order: `TurnReading.features` computes them, the model file names them."""


@dataclass(frozen=True)
class TurnReading:
    """What the detector reads from one informative user turn before deciding.

    The rule's verdict and the signals behind it; the same values are the learned model's
    features, so training and serving read a turn through this one computation.
    """

    embedding: np.ndarray
    assistant_embedding: np.ndarray | None
    closed: bool  # the assistant's last turn (or the caller) closed the task
    invited: bool  # the assistant asked whether there is anything else
    novelty: float  # 1 - the best similarity: how new the turn is against its context
    similarities: tuple[float, float, float]  # to the last user turn, the topic centroid, the assistant's turn (0 if none)
    domain_margin: float  # how much nearer the turn is to another domain than to the topic's (0 if none)
    domain_similarity: float  # the turn's similarity to its nearest domain
    hint_changed: bool
    acknowledges: bool  # "Thanks, that works. Now ..."
    follow_up: str | None  # `follows_up_done_task`'s reading of the text
    content_words: int
    question: bool
    topic_turns: int  # informative user turns in the topic window
    rule: DriftResult  # the hand-built rule's verdict

    def features(self) -> np.ndarray:
        """The values named by `FEATURES`. The interactions let a linear model weigh novelty and
        domain evidence differently once a task is closed, as the rule's two stages do."""
        closed = float(self.closed)
        return np.array(
            [
                closed,
                float(self.invited),
                self.novelty,
                *self.similarities,
                self.domain_margin,
                self.domain_similarity,
                float(any(r.startswith("domain:") for r in self.rule.reasons)),
                float(self.hint_changed),
                float(self.acknowledges),
                float(self.follow_up == "thanks_done_task"),
                float(self.follow_up == "asks_about_result"),
                float(min(self.content_words, 10)),
                float(self.question),
                float(self.topic_turns),
                float(self.rule.drift),
                closed * self.novelty,
                closed * self.domain_margin,
            ],
            dtype=np.float64,
        )


class DriftDetector:
    """Per-session drift detection from user-turn embeddings and optional external signals.

    A turn is read (`read`), decided by the learned model when the config names one and by the
    hand-built rule otherwise, and the verdict folded into the topic (`record`).

    Args:
        config: thresholds, and the learned model's file (`DriftConfig.model`).
        prototypes: domain name -> unit vector; without them only `domain_hint` can supply
            the domain evidence the rule needs.
    """

    def __init__(self, config: DriftConfig | None = None, prototypes: dict[str, np.ndarray] | None = None) -> None:
        self.config = config or DriftConfig()
        self.model = load_model(self.config.model) if self.config.model is not None else None
        self._names = list(prototypes or {})
        self._protos = np.stack([prototypes[n] for n in self._names]) if prototypes else None

    def new_topic(self) -> DriftTopic:
        """An empty topic: the session's first informative turn starts it."""
        return DriftTopic(deque(maxlen=self.config.topic_window))

    def observe(
        self,
        topic: DriftTopic,
        user_embedding: np.ndarray,
        text: str,
        assistant_embedding: np.ndarray | None = None,
        assistant_text: str | None = None,
        task_closed: bool = False,
        domain_hint: str | None = None,
    ) -> DriftResult:
        """Judge one user turn and fold it into the session's topic.

        Args:
            topic: the session's topic, which the turn is folded into.
            user_embedding: unit-norm embedding of the new user turn.
            text: the user turn, used to spot low-information turns.
            assistant_embedding: unit-norm embedding of the assistant's last turn, if any.
            assistant_text: the assistant's last turn, read for whether it closed the task.
            task_closed: the caller knows the last task is closed (its flow completed).
            domain_hint: the dialogue state machine's current domain or intent, if known.

        Returns:
            Whether the turn starts a new topic, its novelty score and the reasons.
        """
        reading = self.read(topic, user_embedding, text, assistant_embedding, assistant_text, task_closed, domain_hint)
        if isinstance(reading, DriftResult):
            return reading
        result = reading.rule
        if self.model is not None:
            probability = self.model.probability(reading.features())
            result = DriftResult(probability >= self.model.threshold, result.score, [f"p:{probability:.2f}", *result.reasons])
        self.record(topic, reading, result.drift)
        return result

    def read(
        self,
        topic: DriftTopic,
        user_embedding: np.ndarray,
        text: str,
        assistant_embedding: np.ndarray | None = None,
        assistant_text: str | None = None,
        task_closed: bool = False,
        domain_hint: str | None = None,
    ) -> TurnReading | DriftResult:
        """Read one user turn against the session's topic (arguments as for `observe`).

        A low-information turn and a session's first turn are settled here, without a model:
        the result is their `DriftResult` (a first turn starts the topic). Otherwise the turn's
        `TurnReading`, whose verdict the caller passes to `record`.
        """
        hint_changed = domain_hint is not None and topic.last_hint not in (None, domain_hint)
        if domain_hint is not None:
            topic.last_hint = domain_hint
        closed = task_closed or (assistant_text is not None and closes_task(assistant_text))
        stage = self.config.closed_task if closed else self.config.open_task
        if is_low_information(text, stage.min_content_words):
            return DriftResult(False, 0.0, ["low_information"])
        if topic.last_user is None:
            self._start_topic(topic, user_embedding)
            return DriftResult(False, 0.0, ["first_turn"])

        centroid = np.mean(topic.window, axis=0)
        assistant = assistant_embedding if assistant_embedding is not None else topic.last_assistant
        references = [topic.last_user, centroid] + ([assistant] if assistant is not None else [])
        similarities = [_cos(user_embedding, r) for r in references]
        novelty = 1.0 - max(similarities)
        domains, margin, similarity = self._domains(user_embedding, centroid)

        evidence = []
        if domains is not None and similarity >= self.config.min_domain_similarity and margin >= stage.domain_margin:
            evidence.append(f"domain:{domains[0]}->{domains[1]}")
        if hint_changed:
            evidence.append(f"hint:{domain_hint}")
        drift = novelty > stage.novelty and bool(evidence)
        acknowledges = opens_with_acknowledgement(text, self.config.open_task.min_content_words)
        invited = assistant_text is not None and asks_for_more(assistant_text)
        follow_up = follows_up_done_task(text)
        # Mid-task, "Great, thanks. Can you also get me a cab there?" still answers the open
        # task and often points into it ("there"): keep its history.
        if drift and not closed and acknowledges:
            drift, evidence = False, [*evidence, "answers_open_task"]
        # Right after "Your cab is on its way." (no "Anything else?" yet), the user is still
        # finishing that task: thanking for it or asking about it, often with a new request.
        if drift and closed and not invited and follow_up is not None:
            drift, evidence = False, [*evidence, follow_up]
        stage_name = "closed_task" if closed else "open_task"
        rule = DriftResult(drift, float(novelty), [f"novelty:{novelty:.2f}", stage_name, *evidence])
        return TurnReading(
            embedding=user_embedding,
            assistant_embedding=assistant_embedding,
            closed=closed,
            invited=invited,
            novelty=novelty,
            similarities=(similarities[0], similarities[1], similarities[2] if assistant is not None else 0.0),
            domain_margin=margin,
            domain_similarity=similarity,
            hint_changed=hint_changed,
            acknowledges=acknowledges,
            follow_up=follow_up,
            content_words=_content_words(text),
            question=text.rstrip().endswith("?"),
            topic_turns=len(topic.window),
            rule=rule,
        )

    def record(self, topic: DriftTopic, reading: TurnReading, drift: bool) -> None:
        """Fold a read turn into the session's topic: a drift starts a new topic with it."""
        if drift:
            self._start_topic(topic, reading.embedding)
        else:
            topic.window.append(reading.embedding)
            topic.last_user = reading.embedding
        if reading.assistant_embedding is not None:
            topic.last_assistant = reading.assistant_embedding

    def resume(
        self,
        user_texts: list[str],
        embed: Callable[[list[str]], np.ndarray],
        domain_hint: str | None = None,
    ) -> DriftTopic:
        """A session's topic rebuilt from its stored user turns (oldest first), e.g. in a new process.

        Only the last `topic_window` turns that are informative mid-task are embedded (right
        after a closed task `observe` also keeps shorter ones; the stored turns do not say
        where tasks closed, so the stricter reading is used).
        """
        window = self.config.topic_window
        informative = [t for t in user_texts if not is_low_information(t, self.config.open_task.min_content_words)]
        vectors = list(embed(informative[-window:])) if informative else []
        return DriftTopic(deque(vectors, maxlen=window), last_user=vectors[-1] if vectors else None, last_hint=domain_hint)

    def _domains(self, embedding: np.ndarray, centroid: np.ndarray) -> tuple[tuple[str, str] | None, float, float]:
        """(topic domain, the turn's nearest domain) when they differ, how much nearer the turn is
        to its own than to the topic's, and its similarity to its own; (None, 0, 0) without prototypes."""
        if self._protos is None:
            return None, 0.0, 0.0
        sims = self._protos @ embedding
        best = int(np.argmax(sims))
        # The topic's domain comes from the centroid, so one odd turn cannot relabel it.
        current = int(np.argmax(self._protos @ centroid))
        if best == current:
            return None, 0.0, float(sims[best])
        return (self._names[current], self._names[best]), float(sims[best] - sims[current]), float(sims[best])

    @staticmethod
    def _start_topic(topic: DriftTopic, embedding: np.ndarray) -> None:
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

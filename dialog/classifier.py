"""Recognise which intent of a bot a user's text expresses, by similarity to its examples.

The embedding model is injected as a plain function so this package stays free of any model
library and can be tested with a toy embedder; the caller passes e.g. a sentence-transformers
`encode` with `normalize_embeddings=True`.

Scoring. An intent's score is the mean of (a) the best cosine to any of its examples and
(b) the mean cosine of its top-3 examples. The max alone lets one odd example capture
unrelated text; the top-k mean alone punishes an intent whose examples are varied. The blend
keeps the sharpness of the max and the robustness of the mean.

Confidence. Raw cosines of sentence embedders rarely exceed 0.8 even for paraphrases, so they
are no probability. We use a softmax over the intent scores divided by a temperature, with one
extra "none of these" logit fixed at `reject_score`: an utterance far from every intent gives
the reject logit most of the mass, so its best intent's confidence is low however the intents
rank among themselves; a clear in-scope utterance gets a confidence close to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from .definition import OUT_OF_SCOPE, BotDefinition

Embed = Callable[[list[str]], NDArray[np.floating]]
"""Maps texts to one unit-normalised embedding row per text."""

_TOP_K = 3

PROMOTE_THRESHOLD = 0.95
"""The engine's default: a reading surer than this counts as confirmed (`DialogueManager.promote_threshold`)."""

FOLLOW_UP_BELOW = PROMOTE_THRESHOLD
"""A message read with at least this confidence alone is never re-read in context."""


@dataclass(frozen=True)
class IntentResult:
    """The classifier's verdict on one utterance.

    Attributes:
        intent: The best intent's name, or "out_of_scope" when it is not convincing enough.
        confidence: Calibrated probability of the best intent, in [0, 1] (also when the
            verdict is out_of_scope, so a caller can see how close it came).
        margin: Best minus second-best intent score, in cosine units.
        scores: Every intent's raw similarity score.
    """

    intent: str
    confidence: float
    margin: float
    scores: dict[str, float]


class IntentReader(Protocol):
    """What the dialogue layer needs of an intent classifier: this module's nearest-example one,
    or a model trained on the bot's examples (`chatcache train BOT`)."""

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        """The verdict on one utterance; `embedding` is its unit-norm embedding when the caller has it."""
        ...


@dataclass(frozen=True)
class PreviousTurn:
    """The user's previous message and the intent the conversation was given for it."""

    text: str
    intent: str


def read_in_context(reader: IntentReader, text: str, previous: PreviousTurn | None, embedding: np.ndarray | None = None) -> IntentResult:
    """Read a message, and a follow-up that leans on the previous turn in its light.

    "and how much does it cost?" right after "how long does a transfer abroad take?" names no
    topic of its own: read alone it is out of scope or a guess. Read together with the previous
    message it continues that topic (the transfer's fee). So a message that is not understood
    on its own (out of scope, or less sure than the promotion needs) is read again after the
    previous message, and that reading is kept when it finds an intent and is surer than the
    message alone. A message that is clear alone is never re-read: context must not pull a
    new request back into the old topic, and an out-of-scope request stays out of scope unless
    the joined reading is both in scope and more confident.
    """
    alone = reader.classify(text, embedding)
    if previous is None or previous.intent == OUT_OF_SCOPE or (alone.intent != OUT_OF_SCOPE and alone.confidence >= FOLLOW_UP_BELOW):
        return alone
    joined = reader.classify(f"{previous.text} {text}")
    if joined.intent != OUT_OF_SCOPE and joined.confidence > alone.confidence:
        return joined
    return alone


class IntentClassifier:
    """Nearest-example intent classifier with an out-of-scope fallback."""

    def __init__(
        self,
        bot: BotDefinition,
        embed: Embed,
        threshold: float | None = None,
        margin: float | None = None,
        temperature: float | None = None,
        reject_score: float | None = None,
    ) -> None:
        """Embed every example of the bot once.

        Args:
            bot: The bot whose intents to recognise; its `classifier` settings are the defaults
                of the four below.
            embed: Text embedder returning unit-normalised rows.
            threshold: Minimum confidence for an intent to be returned.
            margin: Minimum gap between the two best intent scores; below it the text is
                ambiguous and treated as out of scope.
            temperature: Softmax temperature in cosine units; smaller is more decisive.
            reject_score: Score of the "none of these" option; an intent must clearly beat
                it to be confident.
        """
        settings = bot.classifier
        self.threshold = settings.threshold if threshold is None else threshold
        self.margin = settings.margin if margin is None else margin
        self.temperature = settings.temperature if temperature is None else temperature
        self.reject_score = settings.reject_score if reject_score is None else reject_score
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.margin < 0.0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.temperature <= 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        self._embed = embed
        self._names = [intent.name for intent in bot.intents]
        texts = [example for intent in bot.intents for example in intent.examples]
        owner = np.array([i for i, intent in enumerate(bot.intents) for _ in intent.examples])
        self._rows = [np.flatnonzero(owner == i) for i in range(len(self._names))]
        self._examples = np.asarray(embed(texts), dtype=np.float64)
        if self._examples.shape[0] != len(texts):
            raise ValueError(f"embed returned {self._examples.shape[0]} rows for {len(texts)} texts")

    def prototypes(self) -> dict[str, np.ndarray]:
        """One unit vector per intent, the mean of its examples' embeddings (e.g. drift's topics)."""
        means = {name: self._examples[rows].mean(axis=0) for name, rows in zip(self._names, self._rows)}
        return {name: (m / max(float(np.linalg.norm(m)), 1e-12)).astype(np.float32) for name, m in means.items()}

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        """Classify one utterance.

        Args:
            text: What the user said.
            embedding: its unit-norm embedding, when the caller already has it (saves a
                second pass of the embedder).

        Returns:
            The verdict; `intent` is "out_of_scope" when confidence is below the threshold
            or the margin is below the configured margin.
        """
        query = np.asarray(self._embed([text])[0] if embedding is None else embedding, dtype=np.float64)
        scores = self._intent_scores(self._examples @ query)
        logits = np.append(scores, self.reject_score) / self.temperature
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        order = np.argsort(scores)[::-1]
        best = int(order[0])
        gap = float(scores[best] - scores[order[1]]) if len(order) > 1 else float(scores[best])
        confidence = float(probs[best])
        accepted = confidence >= self.threshold and gap >= self.margin
        return IntentResult(
            intent=self._names[best] if accepted else OUT_OF_SCOPE,
            confidence=confidence,
            margin=gap,
            scores={name: float(score) for name, score in zip(self._names, scores)},
        )

    def _intent_scores(self, similarities: NDArray[np.float64]) -> NDArray[np.float64]:
        scores = np.empty(len(self._rows))
        for i, rows in enumerate(self._rows):
            mine = np.sort(similarities[rows])[::-1]
            scores[i] = 0.5 * (mine[0] + mine[:_TOP_K].mean())
        return scores

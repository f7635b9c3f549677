"""Which stored answer a question asks for, learnt from the scope's own wordings of each answer.

Why: the vote between nearest neighbours judges a question by the few stored wordings around
it and one fixed margin. Where a scope holds many wordings of each answer (a bot's knowledge
base, templated replies, the answers to an intent), a linear classifier trained on all of them
draws the borders between answers better: on BANKING77 (cache warmed with 80% of the training
file, the rest replayed; three splits) the vote served 68-71% at 99.0-99.2% precision, a head
trusted at probability 0.8 served 72-74% at 99.2-99.4%. The head only chooses between answers:
the cache still serves through a stored wording of the chosen answer that clears the
similarity threshold and passes verification, so it reaches no further than the vote did.

What it does not do: judge answers with fewer than `min_wordings` wordings (they share one
"other" class, and a question the head puts there is left to the vote), or answers stored after
its fit (the cache leaves a question whose nearest wording has such an answer to the vote).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

# The inverse regularisation strength, chosen on a split of BANKING77's training file: 1 was
# too smooth to reach 0.8 often, 30 and above confident on its errors.
_REGULARISATION_C = 10.0
_OTHER = ""  # the class of every answer with too few wordings to learn; no answer key is empty

@dataclass(frozen=True)
class AnswerHead:
    """A classifier fitted on one scope's entries.

    Attributes:
        classes: the answer key of each output, `_OTHER` for the rare answers' class.
        known: every answer key the fit saw, rare ones included.
    """

    model: LogisticRegression
    classes: tuple[str, ...]
    known: frozenset[str]

    def predict(self, vector: np.ndarray) -> tuple[str | None, float]:
        """The answer key the head gives `vector` (None for the rare answers' class) and its probability."""
        probabilities = self.model.predict_proba(np.asarray(vector, dtype=np.float32).reshape(1, -1))[0]
        best = int(np.argmax(probabilities))
        answer = self.classes[best]
        return (answer or None), float(probabilities[best])


def fit_head(vectors: np.ndarray, answers: list[str], min_wordings: int) -> AnswerHead | None:
    """A head over `answers` with at least `min_wordings` wordings; None when fewer than two have."""
    counts = Counter(answers)
    labels = [answer if counts[answer] >= min_wordings else _OTHER for answer in answers]
    classes = sorted(set(labels))
    if len([c for c in classes if c != _OTHER]) < 2:
        return None
    model = LogisticRegression(C=_REGULARISATION_C, max_iter=1000)
    with warnings.catch_warnings():
        # lbfgs stopping a little short of its tolerance changes no decision worth a warning per fit
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(vectors, labels)
    return AnswerHead(model, tuple(str(c) for c in model.classes_), frozenset(counts))

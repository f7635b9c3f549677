"""Fit the learned drift model on labelled SGD dialogues: `chatcache eval drift --fit OUT.json`.

Every informative user turn (after the first) is read by `DriftDetector.read`, the detector's own
computation, and labelled 1 when it is the first such turn at or up to `TOLERANCE` turns after a
labelled switch (the turn the eval would count as catching it). The topic then moves on as the
labels say (a labelled switch starts a new topic), which is what a detector that decides right
sees online.

The split holds out whole domains, because the dialogues the model will meet come from other
services: `HELD_OUT_DOMAINS` (every dialogue touching one) is never fitted on. Inside the rest,
the dialogues touching `CALIBRATION_DOMAINS` choose the regularisation and the threshold for
models fitted without them; the shipped model is then fitted on all the training dialogues with
that choice. The calibration (isotonic, on grouped folds of the training rows) is scikit-learn's.

Tried and left out (held-out F1, bench/README.md): gradient boosting, which learns the training
dialogues by heart; the raw embeddings of the user's and the assistant's turns as features,
which learn the training domains.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from sklearn.calibration import CalibratedClassifierCV
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from ..steering.drift import FEATURES, DriftConfig, DriftDetector, DriftResult
from ..steering.drift_model import DriftModel
from .drift import HELD_OUT_DOMAINS, TOLERANCE, domains

CALIBRATION_DOMAINS = frozenset({"Events", "Music", "Weather"})
MIN_PRECISION = 0.8
"""A false drift makes the bot forget what the user just said: the threshold maximises F1 among
those whose precision on the calibration dialogues is at least this."""
REGULARISATION = (0.01, 0.1, 1.0)
"""Logistic regression's C, chosen with the threshold on the calibration domains."""


@dataclass
class Rows:
    """The read turns of some dialogues: features, labels and the dialogue each came from."""

    features: np.ndarray
    labels: np.ndarray
    dialogues: np.ndarray

    def where(self, keep: np.ndarray) -> Rows:
        return Rows(self.features[keep], self.labels[keep], self.dialogues[keep])


def read_turns(
    dialogues: Sequence[dict[str, Any]],
    vectors: Sequence[Sequence[np.ndarray]],
    prototypes: dict[str, np.ndarray] | None,
    config: DriftConfig,
) -> Rows:
    """Read every informative user turn of `dialogues` (`vectors[n]`: one unit vector per turn)."""
    detector = DriftDetector(replace(config, model=None), prototypes)
    features, labels, owners = [], [], []
    for n, dialogue in enumerate(dialogues):
        topic, previous, pending = detector.new_topic(), None, None  # pending: a switch no informative turn has answered
        assistant, assistant_text = None, None
        for turn, vector in zip(dialogue["turns"], vectors[n]):
            if turn["speaker"] != "USER":
                assistant, assistant_text = vector, turn["utterance"]
                continue
            services = {frame["service"] for frame in turn["frames"]}
            if previous is not None and not services & previous:
                pending = 0
            elif pending is not None:
                pending += 1
            previous = services
            reading = detector.read(topic, vector, turn["utterance"], assistant, assistant_text)
            if isinstance(reading, DriftResult):
                continue
            label = pending is not None and pending <= TOLERANCE
            pending = None
            features.append(reading.features())
            labels.append(label)
            owners.append(n)
            detector.record(topic, reading, label)
    return Rows(np.array(features), np.array(labels, dtype=int), np.array(owners))


def fit_calibrated(rows: Rows, c: float = 1.0) -> CalibratedClassifierCV:
    """Logistic regression on standardised features (`c`: scikit-learn's inverse regularisation
    strength), calibrated isotonically on 5 folds grouped by dialogue (the turns of one
    dialogue are never on both sides)."""
    pipeline = Pipeline([("scale", StandardScaler()), ("regression", LogisticRegression(C=c, max_iter=1000))])
    folds = list(GroupKFold(n_splits=5).split(rows.features, rows.labels, rows.dialogues))
    return CalibratedClassifierCV(pipeline, method="isotonic", cv=folds, ensemble=False).fit(rows.features, rows.labels)


def choose_threshold(probabilities: np.ndarray, labels: np.ndarray, min_precision: float = MIN_PRECISION) -> float:
    """The threshold with the best F1 among those with precision >= `min_precision` (the highest
    probability seen when none reaches it)."""
    best, best_f1 = float(probabilities.max()), -1.0
    for threshold in np.unique(probabilities):
        chosen = probabilities >= threshold
        precision = float((labels[chosen] == 1).mean())
        f1 = _f1(chosen, labels)
        if precision >= min_precision and f1 > best_f1:
            best, best_f1 = float(threshold), f1
    return best


def _f1(chosen: np.ndarray, labels: np.ndarray) -> float:
    hits = int((chosen & (labels == 1)).sum())
    return 2 * hits / (int(chosen.sum()) + int(labels.sum())) if hits else 0.0


def to_model(calibrated: CalibratedClassifierCV, threshold: float, provenance: dict[str, Any]) -> DriftModel:
    """The fitted scikit-learn objects as the plain numbers `DriftModel` evaluates."""
    fitted = calibrated.calibrated_classifiers_[0]
    scaler, regression = fitted.estimator.named_steps["scale"], fitted.estimator.named_steps["regression"]
    isotonic = fitted.calibrators[0]
    return DriftModel(
        features=FEATURES,
        mean=np.asarray(scaler.mean_, dtype=np.float64),
        scale=np.asarray(scaler.scale_, dtype=np.float64),
        coef=np.asarray(regression.coef_[0], dtype=np.float64),
        intercept=float(regression.intercept_[0]),
        calibration_x=np.asarray(isotonic.X_thresholds_, dtype=np.float64),
        calibration_y=np.asarray(isotonic.y_thresholds_, dtype=np.float64),
        threshold=threshold,
        provenance=provenance,
    )


def fit_drift_model(
    dialogues: Sequence[dict[str, Any]],
    vectors: Sequence[Sequence[np.ndarray]],
    prototypes: dict[str, np.ndarray] | None,
    config: DriftConfig | None = None,
    provenance: dict[str, Any] | None = None,
) -> DriftModel:
    """Read the turns, choose the threshold on the calibration domains, fit on every training dialogue.

    Args:
        dialogues: SGD-style dialogues, all of them: the held-out ones are left out here.
        vectors: per dialogue, one unit embedding per turn.
        prototypes: the detector's domain prototypes (from the schema).
        config: the rule thresholds the features are read with.
        provenance: recorded in the model with the split and the counts.
    """
    started = time.perf_counter()
    config = config or DriftConfig()
    held_out = np.array([bool(domains(d) & HELD_OUT_DOMAINS) for d in dialogues])
    calibration = np.array([bool(domains(d) & CALIBRATION_DOMAINS) for d in dialogues])
    rows = read_turns(dialogues, vectors, prototypes, config)
    _progress(f"read {len(rows.labels)} informative turns ({rows.labels.sum()} catch a switch)", started)
    training = rows.where(~held_out[rows.dialogues])
    fit_part = training.where(~calibration[training.dialogues])
    check_part = training.where(calibration[training.dialogues])
    best: tuple[float, float, float] = (-1.0, 1.0, 1.0)  # (F1, c, threshold) on the calibration domains
    for c in REGULARISATION:
        probabilities = fit_calibrated(fit_part, c).predict_proba(check_part.features)[:, 1]
        threshold = choose_threshold(probabilities, check_part.labels)
        f1 = _f1(probabilities >= threshold, check_part.labels)
        _progress(f"C={c}: threshold {threshold:.3f}, F1 {f1:.3f} on {len(check_part.labels)} turns of the calibration domains", started)
        best = max(best, (f1, c, threshold))
    f1, c, threshold = best
    model = to_model(
        fit_calibrated(training, c),
        threshold,
        {
            **(provenance or {}),
            "split": {
                "held_out_domains": sorted(HELD_OUT_DOMAINS),
                "calibration_domains": sorted(CALIBRATION_DOMAINS),
                "training_dialogues": int((~held_out).sum()),
                "held_out_dialogues": int(held_out.sum()),
                "training_turns": len(training.labels),
                "training_switch_turns": int(training.labels.sum()),
            },
            "regularisation_c": c,
            "threshold_rule": f"best F1 with precision >= {MIN_PRECISION} on the calibration domains (F1 {f1:.3f} there); "
            f"C chosen among {list(REGULARISATION)} the same way",
        },
    )
    _progress(f"fitted on every training dialogue with C={c}", started)
    return model


def provenance(data_path: str | Path, schema_path: str | Path) -> dict[str, Any]:
    """What a model was fitted on, for the people who read the model file."""
    return {
        "fitted": date.today().isoformat(),
        "data": {
            "dialogues": f"{Path(data_path).name} (sha256 {_sha256(data_path)})",
            "schema": f"{Path(schema_path).name} (sha256 {_sha256(schema_path)})",
            "source": "Schema-Guided Dialogue (SGD) dev split, github.com/google-research-datasets/dstc8-schema-guided-dialogue",
            "license": "CC BY-SA 4.0; Rastogi et al., AAAI 2020, Towards Scalable Multi-domain Conversational Agents: "
            "The Schema-Guided Dialogue Dataset. This model is derived from it and shared under the same license.",
        },
        "embedder": "bundled (all-MiniLM-L6-v2)",
        "labels": f"a user turn sharing no service with the previous one; the first informative turn up to {TOLERANCE} later is positive",
        "estimator": f"scikit-learn {sklearn.__version__}: StandardScaler + LogisticRegression, CalibratedClassifierCV(isotonic, 5 folds by dialogue)",
    }


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _progress(message: str, started: float) -> None:
    print(f"[fit {time.perf_counter() - started:6.1f} s] {message}", file=sys.stderr, flush=True)

"""The learned drift model: a logistic regression over `TurnReading.features`, its isotonic
calibration and the decision threshold, stored as plain JSON.

The shipped file (`SHIPPED_MODEL`) is fitted by `chatcache eval drift --fit` (chatcache/evals/
drift_fit.py, which uses scikit-learn); this module only evaluates it, with numpy, so loading a
model runs no code from the file. Its `provenance` says what data, split and features it was
fitted on and what it measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

SHIPPED_MODEL = Path(__file__).with_name("drift_model.json")


@dataclass(frozen=True)
class DriftModel:
    """P(the turn starts a new task) = isotonic(intercept + coef . (x - mean) / scale).

    Args:
        features: the names of the inputs, in order (`drift.FEATURES` when it was fitted).
        mean, scale: the standardisation fitted on the training rows.
        coef, intercept: the logistic regression's weights on standardised inputs.
        calibration_x, calibration_y: the isotonic map from decision value to probability,
            interpolated linearly and clipped at both ends (as scikit-learn's IsotonicRegression).
        threshold: a turn drifts when its calibrated probability is at least this.
        provenance: data, split, settings and measured numbers, for people.
    """

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    calibration_x: np.ndarray
    calibration_y: np.ndarray
    threshold: float
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.features)
        if not (self.mean.shape == self.scale.shape == self.coef.shape == (n,)):
            raise ConfigError(f"drift model: mean, scale and coef need {n} values, one per feature")
        if self.calibration_x.shape != self.calibration_y.shape or len(self.calibration_x) < 2:
            raise ConfigError("drift model: the calibration needs matching x and y of at least 2 points")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"drift model: threshold must be in (0, 1], got {self.threshold}")

    def decision(self, features: np.ndarray) -> np.ndarray:
        """The logistic regression's decision values for rows (or one row) of features."""
        return np.asarray((features - self.mean) / self.scale @ self.coef + self.intercept)

    def probability(self, features: np.ndarray) -> float:
        """The calibrated probability that one turn (its `TurnReading.features`) starts a new task."""
        return float(np.interp(self.decision(features), self.calibration_x, self.calibration_y))

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            "calibration": {"x": self.calibration_x.tolist(), "y": self.calibration_y.tolist()},
            "threshold": self.threshold,
            "provenance": self.provenance,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")


@lru_cache(maxsize=8)
def load_model(path: str | Path) -> DriftModel:
    """Read a model file; every engine on the same file shares one (it is immutable).

    Raises:
        ConfigError: the file is missing or malformed, or names features this code does not compute.
    """
    from .drift import FEATURES  # drift imports this module

    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        model = DriftModel(
            features=tuple(raw["features"]),
            mean=np.asarray(raw["mean"], dtype=np.float64),
            scale=np.asarray(raw["scale"], dtype=np.float64),
            coef=np.asarray(raw["coef"], dtype=np.float64),
            intercept=float(raw["intercept"]),
            calibration_x=np.asarray(raw["calibration"]["x"], dtype=np.float64),
            calibration_y=np.asarray(raw["calibration"]["y"], dtype=np.float64),
            threshold=float(raw["threshold"]),
            provenance=dict(raw.get("provenance", {})),
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read the drift model {path}: {error}") from error
    if model.features != FEATURES:
        raise ConfigError(f"the drift model {path} was fitted on other features; refit it with `chatcache eval drift --fit`")
    return model

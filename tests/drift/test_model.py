"""The learned drift model: the shipped file, its threshold, and the fit that writes one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chatcache.errors import ConfigError
from chatcache.evals.drift_fit import choose_threshold, fit_calibrated, read_turns, to_model, Rows
from chatcache.steering.drift import FEATURES, DriftConfig, DriftDetector, DriftTopic
from chatcache.steering.drift_model import SHIPPED_MODEL, DriftModel, load_model


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float64)
    return v / np.linalg.norm(v)


HOTEL, CAR = unit(1, 0, 0), unit(0, 1, 0)
PROTOTYPES = {"Hotels": HOTEL, "RentalCars": CAR}


def novelty_after_a_closed_task(path: Path, threshold: float, intercept: float = 0.0) -> Path:
    """A model file whose probability is (closed task) x (novelty), clipped to [0, 1]."""
    coef = np.zeros(len(FEATURES))
    coef[FEATURES.index("closed_x_novelty")] = 1.0
    DriftModel(
        features=FEATURES,
        mean=np.zeros(len(FEATURES)),
        scale=np.ones(len(FEATURES)),
        coef=coef,
        intercept=intercept,
        calibration_x=np.array([0.0, 1.0]),
        calibration_y=np.array([0.0, 1.0]),
        threshold=threshold,
    ).save(path)
    return path


def hotel_topic(model: Path) -> tuple[DriftDetector, DriftTopic]:
    """A detector on `model` and a topic it started with a hotel request."""
    found = DriftDetector(DriftConfig(model=model), PROTOTYPES)
    topic = found.new_topic()
    assert not found.observe(topic, HOTEL, "Find me a hotel room in Paris").drift  # the first turn
    return found, topic


def test_the_shipped_model_loads_with_its_provenance() -> None:
    model = load_model(SHIPPED_MODEL)
    assert model.features == FEATURES
    assert 0.0 < model.threshold < 1.0
    assert "CC BY-SA 4.0" in model.provenance["data"]["license"]
    held_out = model.provenance["measured"]["splits"]["held_out"]["detector"]
    assert held_out["precision"] > 0 and held_out["switches"] > 0
    assert DriftDetector().model == model  # the default


def test_a_turn_drifts_when_its_probability_reaches_the_threshold(tmp_path: Path) -> None:
    path = novelty_after_a_closed_task(tmp_path / "m.json", threshold=0.5)
    found, topic = hotel_topic(path)
    result = found.observe(topic, CAR, "I need a rental car at the airport", assistant_text="Your room is booked.")
    assert result.drift and result.reasons[0] == "p:1.00"
    # The same turn while the task is open: probability 0.
    found, topic = hotel_topic(path)
    assert not found.observe(topic, CAR, "I need a rental car at the airport", assistant_text="Which dates?").drift
    strict = novelty_after_a_closed_task(tmp_path / "strict.json", threshold=1.0)
    halfway = unit(1, 1, 0)  # novelty about 0.29 after a closed task
    found, topic = hotel_topic(strict)
    assert not found.observe(topic, halfway, "A rental car near the hotel", assistant_text="Your room is booked.").drift


def test_low_information_and_first_turns_never_reach_the_model(tmp_path: Path) -> None:
    always = novelty_after_a_closed_task(tmp_path / "always.json", threshold=0.5, intercept=5.0)
    found = DriftDetector(DriftConfig(model=always), PROTOTYPES)
    topic = found.new_topic()
    assert found.observe(topic, HOTEL, "Find me a hotel room in Paris").reasons == ["first_turn"]
    result = found.observe(topic, CAR, "Thanks, that's all!", assistant_text="Your room is booked. Anything else?")
    assert not result.drift and result.reasons == ["low_information"]
    assert found.observe(topic, CAR, "I need a rental car at the airport").drift


def test_a_model_fitted_on_other_features_is_refused(tmp_path: Path) -> None:
    path = novelty_after_a_closed_task(tmp_path / "m.json", threshold=0.5)
    raw = json.loads(path.read_text())
    raw["features"][0] = "something_else"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="refit"):
        load_model(path)
    with pytest.raises(ConfigError):
        load_model(tmp_path / "missing.json")


def test_the_model_file_reproduces_scikit_learns_probabilities() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, len(FEATURES)))
    labels = (features[:, 2] + 0.5 * rng.normal(size=400) > 0.8).astype(int)
    rows = Rows(features, labels, np.arange(400) // 4)
    calibrated = fit_calibrated(rows)
    model = to_model(calibrated, 0.5, {})
    expected = calibrated.predict_proba(features[:20])[:, 1]
    assert np.allclose([model.probability(row) for row in features[:20]], expected)


def test_the_threshold_favours_f1_among_the_precise_enough() -> None:
    probabilities = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    labels = np.array([1, 1, 0, 1, 0, 1])
    assert choose_threshold(probabilities, labels, min_precision=0.75) == 0.6  # P 0.75, R 0.75
    assert choose_threshold(probabilities, labels, min_precision=0.5) == 0.4  # P 0.67, R 1
    assert choose_threshold(probabilities, labels, min_precision=1.0) == 0.8


def test_read_turns_labels_the_first_informative_turn_of_a_switch() -> None:
    def user(text: str, service: str) -> dict[str, object]:
        return {"speaker": "USER", "utterance": text, "frames": [{"service": service}]}

    system = {"speaker": "SYSTEM", "utterance": "Your room is booked. Anything else?", "frames": []}
    turns = [
        user("Find me a hotel in Paris", "Hotels_1"),
        user("A hotel with a pool near the centre", "Hotels_1"),
        system,
        user("Okay, thanks.", "RentalCars_1"),  # the switch: low information, not read
        user("I need a rental car there", "RentalCars_1"),  # catches it
        user("A compact rental car please", "RentalCars_1"),
    ]
    vectors = [HOTEL, HOTEL, HOTEL, CAR, CAR, CAR]
    rows = read_turns([{"turns": turns}], [vectors], PROTOTYPES, DriftConfig())
    assert rows.labels.tolist() == [0, 1, 0]
    assert rows.features.shape == (3, len(FEATURES))

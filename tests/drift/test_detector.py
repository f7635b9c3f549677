"""DriftDetector and SeedRule on tiny handmade vectors: no model is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from chatcache.drift import DriftConfig, DriftDetector, SeedRule, is_low_information
from chatcache.errors import ConfigError


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


HOTEL = unit(1, 0, 0, 0)
HOTEL_2 = unit(0.95, 0.05, 0, 0.05)
CAR = unit(0, 1, 0, 0)
WEATHER = unit(0, 0, 1, 0)
PROTOTYPES = {"Hotels": HOTEL, "RentalCars": CAR, "Weather": WEATHER}


def start_hotel_topic(detector: DriftDetector, sid: str = "s") -> None:
    assert not detector.observe(sid, HOTEL, "Find me a hotel room in Paris", domain_hint="Hotels").drift
    assert not detector.observe(sid, HOTEL_2, "A hotel with a pool near the centre", domain_hint="Hotels").drift


def test_seed_rule_fires_on_two_consecutive_far_turns_not_on_one() -> None:
    rule = SeedRule(DriftConfig(seed_window_drop=2.0))  # isolate the consecutive-turn part
    assert not rule.observe("s", HOTEL).drift
    assert not rule.observe("s", CAR).drift  # one far turn
    assert not rule.observe("s", unit(0.1, 1, 0, 0)).drift  # close to the previous one
    assert not rule.observe("s", WEATHER).drift  # far again: the count restarted
    result = rule.observe("s", HOTEL)  # second far turn in a row
    assert result.drift and "consecutive_far" in result.reasons


def test_seed_rule_window_drop_fires_on_a_turn_far_from_the_window() -> None:
    rule = SeedRule(DriftConfig(seed_consecutive=5))
    for v in (HOTEL, HOTEL_2, HOTEL):
        assert not rule.observe("s", v).drift
    result = rule.observe("s", CAR)
    assert result.drift and result.reasons == ["window_drop"]


def test_low_information_turns_never_fire() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector)
    for text in ("Yes, book it.", "Thanks!", "7 pm", "No, that's all, thank you.", "Sounds good to me."):
        result = detector.observe("s", CAR, text, domain_hint="RentalCars", history_gain=0.0)
        assert not result.drift
        assert result.reasons == ["low_information"]
    assert is_low_information("Yes, book it.", 2)
    assert not is_low_information("I need a rental car in Fresno", 2)


def test_domain_hint_change_with_distance_fires() -> None:
    detector = DriftDetector(DriftConfig())  # no prototypes: the hint is the only evidence
    start_hotel_topic(detector)
    result = detector.observe("s", CAR, "I also need a rental car there", domain_hint="RentalCars")
    assert result.drift
    assert "hint:RentalCars" in result.reasons


def test_distance_without_domain_evidence_does_not_fire() -> None:
    detector = DriftDetector(DriftConfig())
    start_hotel_topic(detector)
    result = detector.observe("s", CAR, "I also need a rental car there", domain_hint="Hotels")
    assert not result.drift
    assert result.score > 0.9


def test_hint_change_without_distance_does_not_fire() -> None:
    detector = DriftDetector(DriftConfig())
    start_hotel_topic(detector)
    assert not detector.observe("s", HOTEL, "Reserve that hotel for two nights", domain_hint="Reserve").drift


def test_prototype_domain_change_fires_and_starts_a_new_topic() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector)
    result = detector.observe("s", CAR, "I also need a rental car there")
    assert result.drift
    assert "domain:Hotels->RentalCars" in result.reasons
    # The car topic is now the context: more car talk is no drift.
    assert not detector.observe("s", unit(0.05, 1, 0, 0.05), "A compact rental car until Friday").drift


def test_low_history_gain_with_distance_fires() -> None:
    detector = DriftDetector(DriftConfig(history_gain=0.2))
    start_hotel_topic(detector)
    assert not detector.observe("s", CAR, "I also need a rental car there", history_gain=0.5).drift
    result = detector.observe("s", WEATHER, "Will it rain in Paris tomorrow", history_gain=0.05)
    assert result.drift and "low_history_gain" in result.reasons


def test_assistant_turn_counts_as_context() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector)
    # The assistant offered a car: a user turn about cars continues that thread.
    result = detector.observe("s", CAR, "Yes, a rental car would help", assistant_embedding=CAR)
    assert not result.drift
    assert result.score < 0.01


def test_reset_clears_state() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector)
    detector.reset("s")
    result = detector.observe("s", CAR, "I need a rental car in Fresno", domain_hint="RentalCars")
    assert not result.drift
    assert result.reasons == ["first_turn"]
    rule = SeedRule(DriftConfig(seed_window_drop=2.0))
    rule.observe("s", HOTEL)
    rule.observe("s", CAR)
    rule.reset("s")
    assert rule.observe("s", WEATHER).reasons == ["first_turn"]


def test_sessions_are_independent() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector, "a")
    assert detector.observe("b", CAR, "I need a rental car in Fresno").reasons == ["first_turn"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"novelty": -0.1},
        {"domain_margin": 3.0},
        {"seed_cos": 1.5},
        {"min_domain_similarity": -2.0},
        {"topic_window": 0},
        {"seed_consecutive": 0},
        {"seed_window": 0},
        {"min_content_words": -1},
    ],
)
def test_config_validation_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        DriftConfig(**kwargs)


def test_handover_turn_moves_the_topic_without_drifting() -> None:
    detector = DriftDetector(DriftConfig(), PROTOTYPES)
    start_hotel_topic(detector)
    result = detector.observe("s", CAR, "Great, thanks. Can you also get me a rental car there?")
    assert not result.drift
    assert "handover" in result.reasons
    # The topic moved to cars: the next car turn is no drift, a weather turn is.
    assert not detector.observe("s", unit(0.05, 1, 0, 0.05), "A compact rental car until Friday").drift
    assert detector.observe("s", WEATHER, "Will it rain in Fresno tomorrow").drift

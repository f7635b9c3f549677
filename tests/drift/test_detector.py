"""The hand-built rule (`DriftConfig(model=None)`) and SeedRule on tiny handmade vectors: no model is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from chatcache.steering.drift import (
    DriftTopic,
    DriftConfig,
    DriftDetector,
    SeedRule,
    StageThresholds,
    asks_for_more,
    closes_task,
    follows_up_done_task,
    is_low_information,
    returns_to_dropped,
)
from chatcache.errors import ConfigError


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


HOTEL = unit(1, 0, 0, 0)
HOTEL_2 = unit(0.95, 0.05, 0, 0.05)
CAR = unit(0, 1, 0, 0)
WEATHER = unit(0, 0, 1, 0)
PROTOTYPES = {"Hotels": HOTEL, "RentalCars": CAR, "Weather": WEATHER}
RULES = DriftConfig(model=None)


def start_hotel_topic(detector: DriftDetector) -> DriftTopic:
    topic = detector.new_topic()
    assert not detector.observe(topic, HOTEL, "Find me a hotel room in Paris", domain_hint="Hotels").drift
    assert not detector.observe(topic, HOTEL_2, "A hotel with a pool near the centre", domain_hint="Hotels").drift
    return topic


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


@pytest.mark.parametrize("assistant_text", ["Which date would you like?", "Your room is booked. Anything else?"])
def test_low_information_turns_never_fire(assistant_text: str) -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    for text in ("Thanks!", "7 pm", "No, that's all, thank you.", "Sounds good to me."):
        result = detector.observe(topic, CAR, text, assistant_text=assistant_text, domain_hint="RentalCars")
        assert not result.drift
        assert result.reasons == ["low_information"]


def test_one_content_word_is_low_information_only_while_the_task_is_open() -> None:
    assert is_low_information("Yes, book it.", 2)
    assert not is_low_information("I need a hotel.", 1)
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    assert detector.observe(topic, CAR, "A car.", assistant_text="Which room type?").reasons == ["low_information"]
    assert detector.observe(topic, CAR, "A car.", assistant_text="Your room is booked.").drift
    assert not is_low_information("I need a rental car in Fresno", 2)


def test_domain_hint_change_with_distance_fires() -> None:
    detector = DriftDetector(RULES)  # no prototypes: the hint is the only evidence
    topic = start_hotel_topic(detector)
    result = detector.observe(topic, CAR, "I also need a rental car there", domain_hint="RentalCars")
    assert result.drift
    assert "hint:RentalCars" in result.reasons


def test_distance_without_domain_evidence_does_not_fire() -> None:
    detector = DriftDetector(RULES)
    topic = start_hotel_topic(detector)
    result = detector.observe(topic, CAR, "I also need a rental car there", domain_hint="Hotels")
    assert not result.drift
    assert result.score > 0.9


def test_hint_change_without_distance_does_not_fire() -> None:
    detector = DriftDetector(RULES)
    topic = start_hotel_topic(detector)
    assert not detector.observe(topic, HOTEL, "Reserve that hotel for two nights", domain_hint="Reserve").drift


def test_prototype_domain_change_fires_and_starts_a_new_topic() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    result = detector.observe(topic, CAR, "I also need a rental car there")
    assert result.drift
    assert "domain:Hotels->RentalCars" in result.reasons
    # The car topic is now the context: more car talk is no drift.
    assert not detector.observe(topic, unit(0.05, 1, 0, 0.05), "A compact rental car until Friday").drift


# Halfway between the hotel and car axes, a little closer to cars: novelty about 0.3,
# domain margin about 0.2 -- enough after a closed task, not while one is open.
CAR_ISH = unit(0.55, 0.8, 0, 0)


def test_a_closed_task_lowers_the_bar_an_open_one_raises_it() -> None:
    open_task = DriftDetector(RULES, PROTOTYPES)
    open_task_topic = start_hotel_topic(open_task)
    result = open_task.observe(open_task_topic, CAR_ISH, "What about a car rental in Paris", assistant_text="Shall I book it?")
    assert not result.drift
    assert "open_task" in result.reasons and "domain:Hotels->RentalCars" not in result.reasons

    closed = DriftDetector(RULES, PROTOTYPES)
    closed_topic = start_hotel_topic(closed)
    result = closed.observe(closed_topic, CAR_ISH, "What about a car rental in Paris", assistant_text="Your room is booked.")
    assert result.drift
    assert "closed_task" in result.reasons and "domain:Hotels->RentalCars" in result.reasons


def test_the_caller_can_say_the_task_is_closed() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    result = detector.observe(topic, CAR_ISH, "What about a car rental in Paris", task_closed=True)
    assert result.drift and "closed_task" in result.reasons


@pytest.mark.parametrize(
    "text",
    [
        "Is there anything else I can help you with?",
        "Can I help you with something else?",
        "Do you need any further assistance?",
        "Your table is booked.",
        "Your alarm has been set.",
        "The transfer was successful and will complete in 3 days.",
        "You're welcome.",
        "Your appointment went through.",
        "You're all set with the rental car.",
        "Your cab is on it's way.",
        "How else may I help you today?",
        "Could I further assist you?",
        "What more can I do for you?",
    ],
)
def test_closes_task_recognises_completions_and_requests_for_more(text: str) -> None:
    assert closes_task(text)


@pytest.mark.parametrize(
    "text",
    [
        "I found 3 hotels. How about the Ritz?",
        "Please confirm: a table for 2 is booked at 7 pm?",
        "Do you prefer music, sports or something else?",
        "Which city are you staying in?",
        "I found 1 film you might enjoy: Hackers.",
    ],
)
def test_closes_task_leaves_offers_and_questions_open(text: str) -> None:
    assert not closes_task(text)


def test_asks_for_more_tells_an_invitation_from_a_report() -> None:
    assert asks_for_more("Your room is booked. Anything else?")
    assert asks_for_more("How else may I help you?")
    assert not asks_for_more("Your room is booked.")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Thanks! Can you get me a rental car there?", "thanks_done_task"),
        ("I appreciate it. Now find me a restaurant.", "thanks_done_task"),
        ("What's their address?", "asks_about_result"),
        ("How long will the ride take?", "asks_about_result"),
        ("Can you also find me a rental car?", None),
        ("I need a rental car in Fresno.", None),
    ],
)
def test_follows_up_done_task(text: str, reason: str | None) -> None:
    assert follows_up_done_task(text) == reason


def test_thanks_for_a_reported_task_keeps_its_history_until_the_assistant_asks_for_more() -> None:
    text = "Thanks! Can you get me a rental car there?"
    reported = DriftDetector(RULES, PROTOTYPES)
    reported_topic = start_hotel_topic(reported)
    result = reported.observe(reported_topic, CAR, text, assistant_text="Your room is booked.")
    assert not result.drift
    assert "closed_task" in result.reasons and "thanks_done_task" in result.reasons
    # "Anything else?" means the user's previous turn closed the task: the request is new.
    invited = DriftDetector(RULES, PROTOTYPES)
    invited_topic = start_hotel_topic(invited)
    assert invited.observe(invited_topic, CAR, text, assistant_text="Your room is booked. Anything else?").drift


def test_a_question_about_a_reported_task_keeps_its_history() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    result = detector.observe(topic, CAR, "How much is the parking fee?", assistant_text="Your room is booked.")
    assert not result.drift and "asks_about_result" in result.reasons
    # A question that asks for something new is a new request.
    fresh = DriftDetector(RULES, PROTOTYPES)
    fresh_topic = start_hotel_topic(fresh)
    assert fresh.observe(fresh_topic, CAR, "Can you find me a rental car?", assistant_text="Your room is booked.").drift


def test_assistant_turn_counts_as_context() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    # The assistant offered a car: a user turn about cars continues that thread.
    result = detector.observe(topic, CAR, "Yes, a rental car would help", assistant_embedding=CAR)
    assert not result.drift
    assert result.score < 0.01


def test_a_new_topic_starts_afresh() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    start_hotel_topic(detector)
    result = detector.observe(detector.new_topic(), CAR, "I need a rental car in Fresno", domain_hint="RentalCars")
    assert not result.drift
    assert result.reasons == ["first_turn"]


def test_the_seed_rule_forgets_a_session_on_reset() -> None:
    rule = SeedRule(DriftConfig(seed_window_drop=2.0))
    rule.observe("s", HOTEL)
    rule.observe("s", CAR)
    rule.reset("s")
    assert rule.observe("s", WEATHER).reasons == ["first_turn"]


def test_sessions_are_independent() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    start_hotel_topic(detector)
    assert detector.observe(detector.new_topic(), CAR, "I need a rental car in Fresno").reasons == ["first_turn"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed_ratio": -0.1},
        {"seed_window_drop": 3.0},
        {"seed_cos": 1.5},
        {"min_domain_similarity": -2.0},
        {"topic_window": 0},
        {"seed_consecutive": 0},
        {"seed_window": 0},
        {"open_task": {"novelty": 0.5}},
    ],
)
def test_config_validation_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        DriftConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_content_words": -1, "novelty": 0.5, "domain_margin": 0.1},
        {"min_content_words": 1, "novelty": -0.1, "domain_margin": 0.1},
        {"min_content_words": 1, "novelty": 0.5, "domain_margin": 2.5},
    ],
)
def test_stage_thresholds_reject_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        StageThresholds(**kwargs)  # type: ignore[arg-type]


def test_acknowledging_an_open_task_keeps_its_history() -> None:
    detector = DriftDetector(RULES, PROTOTYPES)
    topic = start_hotel_topic(detector)
    text = "Great, thanks. Can you also get me a rental car there?"
    result = detector.observe(topic, CAR, text, assistant_text="How about the Ritz, 4 stars?")
    assert not result.drift
    assert "answers_open_task" in result.reasons
    # Once the assistant closed the task, the same turn starts a new topic.
    closed = DriftDetector(RULES, PROTOTYPES)
    closed_topic = start_hotel_topic(closed)
    assert closed.observe(closed_topic, CAR, text, assistant_text="Your room is booked. Anything else?").drift


def test_resume_rebuilds_the_topic_from_stored_turns() -> None:
    vectors = {"Find me a hotel room in Paris": HOTEL, "Yes.": CAR, "A hotel with a pool near the centre": HOTEL_2}
    embedded: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.append(texts)
        return np.stack([vectors[t] for t in texts])

    detector = DriftDetector(DriftConfig(topic_window=1, model=None), PROTOTYPES)
    topic = detector.resume(list(vectors), embed, domain_hint="Hotels")
    assert embedded == [["A hotel with a pool near the centre"]]  # informative turns, last window only
    result = detector.observe(topic, CAR, "I also need a rental car there", assistant_text="Your room is booked.")
    assert result.drift and "domain:Hotels->RentalCars" in result.reasons

    fresh = DriftDetector(RULES, PROTOTYPES)
    fresh_topic = fresh.resume([], embed)  # a session with no stored turns starts its topic with the next one
    assert fresh.observe(fresh_topic, CAR, "I need a rental car in Fresno").reasons == ["first_turn"]


def test_the_turn_after_a_reset_undoes_it_only_when_closer_to_the_dropped_topic_by_the_margin() -> None:
    hours, transfer = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    dropped, since = np.stack([hours]), np.stack([transfer])
    back = np.array([0.9, 0.436])  # cos 0.9 to the dropped turn, 0.44 to the turn since
    assert returns_to_dropped(back, dropped, since, margin=0.1)
    assert not returns_to_dropped(back, dropped, since, margin=0.5)
    assert not returns_to_dropped(np.array([0.6, 0.8]), dropped, since, margin=0.1)  # nearer the new topic
    assert not returns_to_dropped(back, dropped[:0], since, margin=0.1)  # nothing was dropped

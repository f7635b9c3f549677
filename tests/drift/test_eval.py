"""The drift eval's labelling and matching, on a tiny handmade dialogue file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chatcache.evals.drift import evaluate_drift, label_switches, main, match_detections
from chatcache.steering.drift import FEATURES, DriftConfig
from chatcache.steering.drift_model import DriftModel

KEYWORDS = ("hotel", "car", "weather")
RULES = DriftConfig(model=None)


def fake_embed(texts: list[str]) -> np.ndarray:
    """One axis per keyword, a last axis for everything else."""
    out = np.zeros((len(texts), len(KEYWORDS) + 1), dtype=np.float32)
    for row, text in enumerate(texts):
        hits = [i for i, k in enumerate(KEYWORDS) if k in text.lower()]
        out[row, hits or [len(KEYWORDS)]] = 1.0
    return out


def user(text: str, *services: str) -> dict:
    return {"speaker": "USER", "utterance": text, "frames": [{"service": s} for s in services]}


def system(text: str) -> dict:
    return {"speaker": "SYSTEM", "utterance": text, "frames": []}


def write_data(tmp_path: Path) -> tuple[Path, Path]:
    dialogue = {
        "dialogue_id": "1_00000",
        "turns": [
            user("Find me a hotel in Paris", "Hotels_1"),
            system("Which dates?"),
            user("A hotel from Monday to Friday", "Hotels_1"),
            system("Booked."),
            user("Okay, thanks.", "RentalCars_1"),  # labelled switch (index 2), low information
            system("Anything else?"),
            user("I need a rental car there", "RentalCars_1"),  # detected one turn late
            system("Done."),
            user("A car with automatic gears", "Weather_1", "RentalCars_1"),  # shares a service: no switch
        ],
    }
    data = tmp_path / "dialogues.jsonl"
    data.write_text(json.dumps(dialogue) + "\n")
    schema = [
        {"service_name": "Hotels_1", "description": "hotel rooms", "intents": [{"description": "Reserve a hotel"}]},
        {"service_name": "RentalCars_1", "description": "car rental", "intents": [{"description": "Rent a car"}]},
        {"service_name": "Weather_1", "description": "weather", "intents": [{"description": "Get the weather"}]},
    ]
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(schema))
    return data, schema_path


def test_label_switches_needs_no_shared_service() -> None:
    services = [{"A"}, {"A"}, {"B"}, {"B", "C"}, {"C"}, {"D"}]
    assert label_switches(services) == [2, 5]
    assert label_switches([{"A"}]) == []


def test_match_counts_a_switch_once_within_two_turns() -> None:
    assert match_detections([2], [2, 3, 4]) == [0]  # later detections are false positives
    assert match_detections([2], [4]) == [2]
    assert match_detections([2], [5]) == []  # too late
    assert match_detections([2], [1]) == []  # before the switch
    assert match_detections([2, 3], [3, 4]) == [1, 1]  # each detection serves one switch


def never_drifts(path: Path) -> Path:
    """A model file whose probability is 0 for every turn."""
    n = len(FEATURES)
    model = DriftModel(FEATURES, np.zeros(n), np.ones(n), np.zeros(n), 0.0, np.array([0.0, 1.0]), np.array([0.0, 1.0]), 0.5)
    model.save(path)
    return path


def test_evaluate_drift_end_to_end(tmp_path: Path) -> None:
    data, schema = write_data(tmp_path)
    result = evaluate_drift(data, schema, embed=fake_embed, config=RULES)
    assert result["switches"] == 1
    assert result["detections"] == 1
    assert result["precision"] == 1.0 and result["recall"] == 1.0 and result["f1"] == 1.0
    assert result["mean_delay"] == 1.0
    assert result["seed_rule"]["switches"] == 1
    assert result["resets_undone"] == {"true": 0, "false": 0, "true_detections": 1, "false_detections": 0}  # the next turn stays on cars
    without_schema = evaluate_drift(data, embed=fake_embed, config=RULES)
    assert without_schema["detections"] == 0  # no domain evidence, no drift


def test_the_learned_detector_and_the_rules_are_reported_side_by_side(tmp_path: Path) -> None:
    data, schema = write_data(tmp_path)
    config = DriftConfig(model=never_drifts(tmp_path / "model.json"))
    result = evaluate_drift(data, schema, embed=fake_embed, config=config)
    assert result["detections"] == 0 and result["rules"]["detections"] == 1
    # The dialogue touches no held-out domain: it counts for the training split.
    training, held_out = result["splits"]["training"], result["splits"]["held_out"]
    assert training["detector"]["switches"] == 1 and training["rules"]["detections"] == 1
    assert held_out["rules"]["switches"] == 0


def test_main_prints_one_json_object(tmp_path: Path, capsys, monkeypatch) -> None:
    data, schema = write_data(tmp_path)
    monkeypatch.setattr("chatcache.evals.drift._bundled_embed", fake_embed)  # private: the bundled embedder it loads itself
    model = never_drifts(tmp_path / "model.json")
    assert main(["--data", str(data), "--schema", str(schema), "--model", str(model), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["switches"] == 1 and printed["rules"]["detections"] == 1 and "seed_rule" in printed


def test_a_reset_the_next_turn_goes_back_on_is_counted_undone(tmp_path: Path) -> None:
    data, schema = write_data(tmp_path)
    dialogue = json.loads(data.read_text())
    dialogue["turns"][-1] = user("Oh, and the hotel needs a late checkout", "Hotels_1")  # back to the dropped topic
    data.write_text(json.dumps(dialogue) + "\n")
    result = evaluate_drift(data, schema, embed=fake_embed, config=RULES)
    # The car reset is undone; the detector alone also takes the hotel turn for a switch (labelled one).
    assert result["resets_undone"] == {"true": 1, "false": 0, "true_detections": 2, "false_detections": 0}

"""`chatcache eval followups`: follow-ups read alone and in context, on tiny SGD-shaped files.

A toy embedder gives each keyword its own axis, so which turns a classifier understands alone
and which only after the previous turn can be worked out by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from chatcache.cli import main
from chatcache.evals import followups
from chatcache.evals.followups import UserTurn, evaluate_followups
from chatcache.dialog import OUT_OF_SCOPE, IntentResult

KEYWORDS = ("restaurant", "weather")


def toy_embed(texts: list[str]) -> np.ndarray:
    """One axis per keyword, a last axis for text with none: "and the day after" is near nothing."""
    out = np.zeros((len(texts), len(KEYWORDS) + 1), dtype=np.float32)
    for row, text in enumerate(texts):
        hits = [i for i, keyword in enumerate(KEYWORDS) if keyword in text.lower()]
        out[row, hits or [len(KEYWORDS)]] = 1.0
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def user(text: str, *frames: tuple[str, str]) -> dict[str, object]:
    return {"speaker": "USER", "utterance": text, "frames": [{"service": s, "acts": [], "active_intent": i} for s, i in frames]}


def dialogue(*users: dict[str, object]) -> str:
    turns = [turn for u in users for turn in (u, {"speaker": "SYSTEM", "utterance": "Okay.", "frames": []})]
    return json.dumps({"dialogue_id": "1_00000", "turns": turns})


FOOD, WEATHER, CARS = ("Restaurants_2", "FindRestaurants"), ("Weather_1", "GetWeather"), ("RentalCars_1", "GetCarsAvailable")
DIALOGUES = [
    # Even dialogues teach the intents they start.
    dialogue(user("I want a restaurant for dinner", FOOD), user("in San Jose", FOOD), user("how is the weather there", WEATHER)),
    dialogue(
        user("hello", ("Restaurants_2", "NONE")),  # no intent: no row
        user("find me a restaurant", FOOD),  # a start, clear alone
        user("what is their phone number", FOOD),  # a follow-up: out of scope alone, the restaurant's after the turn before
        user("thanks, what is the weather tomorrow", WEATHER, FOOD),  # a start that thanks for the restaurant: the new intent
        user("and the day after", WEATHER),  # a follow-up
    ),
    dialogue(user("what is the weather like", WEATHER)),
    dialogue(
        user("find me a restaurant", FOOD),
        user("is it sunny there", WEATHER),  # a start no reading gets: in context it is pulled back to the restaurant
        user("rent me a car", CARS),  # an intent the even dialogues never start: left out
    ),
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_follow_up_wrong_alone_is_right_in_context_and_starts_are_counted_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(followups, "_embedder", lambda name: toy_embed)
    assert main(["eval", "followups", "--json", "--data", str(write(tmp_path / "dialogues.jsonl", DIALOGUES))]) == 0
    out, progress = capsys.readouterr()
    report = json.loads(out)
    assert (report["follow_ups"], report["starts"], report["unknown_intent_rows"]) == (2, 4, 1)
    assert (report["intents"], report["examples"], report["dialogues"]) == (2, 3, {"teaching": 2, "testing": 2})
    alone, context, chained = (report["readings"][name] for name in ("alone", "context", "chained"))
    assert alone == {
        "follow_up_accuracy": 0.0,
        "start_accuracy": 3 / 4,
        "follow_ups_out_of_scope": 1.0,
        "follow_ups_rescued": 0.0,
        "starts_pulled_back": 0.0,
    }
    assert context == {
        "follow_up_accuracy": 1.0,
        "start_accuracy": 3 / 4,  # "is it sunny there" is wrong either way
        "follow_ups_out_of_scope": 0.0,
        "follow_ups_rescued": 1.0,
        "starts_pulled_back": 1 / 4,
    }
    assert chained == context  # every previous turn was read right
    assert "embedding examples and test turns" in progress and isinstance(report["seconds"], float)


class ScriptedReader:
    """An intent reader with a verdict per text: the evaluation takes any classifier."""

    def __init__(self, verdicts: dict[str, str]) -> None:
        self.verdicts = verdicts

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        intent = self.verdicts.get(text, OUT_OF_SCOPE)
        return IntentResult(intent=intent, confidence=0.9 if intent != OUT_OF_SCOPE else 0.1, margin=0.1, scores={})


def test_the_chained_reading_is_told_what_the_classifier_read_before_not_the_gold_intent() -> None:
    turns = [UserTurn("I'd like to eat out", "FindRestaurants"), UserTurn("their phone number?", "FindRestaurants")]
    reader = ScriptedReader({"I'd like to eat out their phone number?": "FindRestaurants"})
    report = evaluate_followups(reader, [turns], {"FindRestaurants"})
    assert (report.follow_ups, report.starts) == (1, 1)
    # The first turn is read out of scope, so the chained reading does not re-read the follow-up.
    assert report.readings["context"].follow_up_accuracy == 1.0
    assert report.readings["chained"].follow_up_accuracy == 0.0


def test_unusable_data_exits_2_naming_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (tmp_path / "missing.jsonl", ["missing.jsonl", "cannot read"]),
        (write(tmp_path / "text.jsonl", [DIALOGUES[0], "not json"]), ["text.jsonl", "line 2", "Invalid JSON"]),
        (write(tmp_path / "fields.jsonl", ['{"dialogue_id": "1", "turns": [{"speaker": "USER", "frames": []}]}']), ["line 1", "turns.0.utterance"]),
        (write(tmp_path / "short.jsonl", DIALOGUES[:1]), ["short.jsonl", "no follow-ups"]),
    ]
    for path, words in cases:
        assert main(["eval", "followups", "--data", str(path)]) == 2, path
        out, err = capsys.readouterr()
        assert not out and err.startswith("chatcache eval followups: "), (path, err)
        assert all(word in err for word in words), (path, err)


def test_the_trained_reader_is_trained_once_on_the_teaching_turns_and_reads_as_the_model_does(
    tmp_path: Path, tiny_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--trained` trains `chatcache train`'s model on the even dialogues' starts, stores it, and
    scores the odd dialogues as that model reads them one message at a time."""
    from chatcache.dialog.definition import TrainingSettings
    from chatcache.intents.trained import TrainedIntentClassifier, model_dir

    toy = TrainingSettings(encoder=str(tiny_encoder_dir), epochs=30, batch_size=8, body_learning_rate=1e-3, head_learning_rate=5e-2)
    monkeypatch.setattr(followups, "TRAINING", toy)
    data = write(tmp_path / "dialogues.jsonl", DIALOGUES)
    assert main(["eval", "followups", "--json", "--trained", "--epochs", "20", "--data", str(data)]) == 0
    out, progress = capsys.readouterr()
    report = json.loads(out)
    assert "training on 2 examples of 2 labels for 20 epochs" in progress  # one of the three held out to calibrate
    reader = report["classifier"]
    assert reader["settings"] == toy.model_copy(update={"epochs": 20}).model_dump() and reader["training"]["training_seconds"] > 0
    assert (report["follow_ups"], report["starts"], report["unknown_intent_rows"]) == (2, 4, 1)

    model = TrainedIntentClassifier(model_dir(reader["trained"]))
    testing = followups.read_dialogues(data)[1::2]
    one_at_a_time = followups.evaluate_followups(model, testing, {"FindRestaurants", "GetWeather"})
    assert report["readings"] == {name: dataclasses.asdict(reading) for name, reading in one_at_a_time.readings.items()}
    assert model.classify("find me a restaurant").intent == "FindRestaurants"  # what the toy examples teach
    assert report["readings"]["alone"]["start_accuracy"] >= 2 / 4  # both restaurant starts at least

    assert main(["eval", "followups", "--json", "--trained", "--epochs", "20", "--data", str(data)]) == 0
    again, progress = capsys.readouterr()
    assert "training on" not in progress and json.loads(again)["readings"] == report["readings"]  # the stored model, read again


def test_epochs_without_the_trained_reader_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "followups", "--epochs", "3", "--data", str(write(tmp_path / "dialogues.jsonl", DIALOGUES))]) == 2
    assert "needs --trained" in capsys.readouterr().err

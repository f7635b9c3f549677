"""`chatcache eval intents`: intent accuracy, the fallback's recall and precision, on tiny files.

The end-to-end tests run the real bundled MiniLM on a handful of unmistakable queries, so the
expected metrics can be worked out by hand from which rows are out of scope or mislabelled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcache.cli import main
from chatcache.evals.intent_data import held_out_split
from chatcache.evals.intents import measure, precision_at_share
from chatcache.dialog import OUT_OF_SCOPE, IntentResult

TRAIN = {
    "lost_card": ["I have lost my card", "my card is lost", "I lost my bank card", "I cannot find my card anywhere", "where did my card go, I lost it"],
    "exchange_rate": ["what is the exchange rate", "what exchange rate do you use", "how much is the euro exchange rate", "tell me today's exchange rate", "which exchange rate applies"],
    "top_up_limits": ["what is the top up limit", "how much can I top up", "is there a limit on top ups", "what are the top-up limits", "maximum amount I can top up"],
}
OUT_OF_SCOPE_QUERIES = ["what is the weather in Paris tomorrow", "give me a recipe for pizza dough", "set an alarm for seven in the morning"]


def write_csv(path: Path, rows: list[tuple[str, str]], header: str = "text,category") -> Path:
    path.write_text(header + "\n" + "".join(f'"{text}",{label}\n' for text, label in rows), encoding="utf-8")
    return path


def rows_of(by_label: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(text, label) for label, texts in by_label.items() for text in texts]


def write_clinc(directory: Path) -> Path:
    """A CLINC150-shaped file: one banking query in `val` (in scope for a bank) and one alarm query (not)."""
    directory.mkdir(exist_ok=True)
    data = {
        "train": [[text, label] for text, label in rows_of(TRAIN)],
        "val": [["I have lost my card", "lost_card"], ["what exchange rate is used", "exchange_rate"],
                ["please freeze my bank account", "freeze_account"], [OUT_OF_SCOPE_QUERIES[2], "alarm"]],
        "oos_train": [[OUT_OF_SCOPE_QUERIES[1], "oos"]],
        "oos_val": [[OUT_OF_SCOPE_QUERIES[0], "oos"]],
    }  # fmt: skip
    (directory / "domains.json").write_text(json.dumps({"banking": ["freeze_account", "lost_card", "exchange_rate"], "credit_cards": [], "utility": ["alarm"]}))
    path = directory / "data_full_train_val.json"
    path.write_text(json.dumps(data))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict[str, object]:
    assert main(["eval", "intents", "--json", *map(str, args)]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def verdict(intent: str, confidence: float) -> IntentResult:
    return IntentResult(intent=intent, confidence=confidence, margin=0.1, scores={})


def test_metrics_count_out_of_scope_answers_as_wrong_and_confidence_strictly_above_the_threshold() -> None:
    rows = [("a", "x"), ("b", "x"), ("c", "y"), ("d", "y"), ("e", OUT_OF_SCOPE), ("f", OUT_OF_SCOPE)]
    results = [
        verdict("x", 0.99),  # right, confident
        verdict("y", 0.97),  # wrong, confident
        verdict("y", 0.95),  # right, not above 0.95
        verdict(OUT_OF_SCOPE, 0.3),  # an in-scope query refused
        verdict(OUT_OF_SCOPE, 0.2),  # refused rightly
        verdict("x", 0.98),  # out of scope, answered surely
    ]
    metrics = measure(rows, results, promote_threshold=0.95)
    assert (metrics.n, metrics.in_scope, metrics.out_of_scope) == (6, 4, 2)
    assert metrics.accuracy == 2 / 4
    assert (metrics.oos_recall, metrics.oos_precision, metrics.in_scope_rejected) == (1 / 2, 1 / 2, 1 / 4)
    assert (metrics.confident_share, metrics.confident_accuracy, metrics.oos_confident) == (2 / 4, 1 / 2, 1 / 2)
    nothing_out = measure(rows[:1], results[:1])
    assert (nothing_out.oos_recall, nothing_out.oos_precision, nothing_out.oos_confident) == (None, None, None)


def test_precision_at_another_mix_follows_from_the_recall_and_the_in_scope_rejections() -> None:
    # 100 out-of-scope in 3,100 queries: 90 caught, 60 of 3,000 in-scope rejected -> 0.6 here;
    # the same reader where 1,000 of 5,500 are out of scope: 900 caught, 90 of 4,500 rejected.
    assert precision_at_share(0.9, 0.02, 100 / 3100) == pytest.approx(90 / 150)
    assert precision_at_share(0.9, 0.02, 1000 / 5500) == pytest.approx(900 / 990)
    assert precision_at_share(0.0, 0.0, 0.5) is None


def test_the_held_out_split_is_stratified_deterministic_and_keeps_an_example_per_label() -> None:
    by_label = {"many": [f"m{i}" for i in range(10)], "few": [f"f{i}" for i in range(5)], "two": ["t0", "t1"], "one": ["o0"]}
    train, test = held_out_split(by_label, 0.2, seed=0)
    held = {label: [text for text, row_label in test if row_label == label] for label in by_label}
    assert {label: len(texts) for label, texts in held.items()} == {"many": 2, "few": 1, "two": 1, "one": 0}
    for label, texts in by_label.items():
        assert sorted(train[label] + held[label]) == sorted(texts) and train[label]
        assert train[label] == [text for text in texts if text in train[label]]  # file order: "first N" is well defined
    assert held_out_split(by_label, 0.2, seed=0) == (train, test)
    assert held_out_split(by_label, 0.2, seed=1)[1] != test
    # A label's held-out rows do not depend on which other labels the file has.
    assert held_out_split({"many": by_label["many"]}, 0.2, seed=0)[1] == [row for row in test if row[1] == "many"]


@pytest.mark.bundled
def test_a_csv_is_scored_on_its_held_out_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_csv(tmp_path / "train.csv", rows_of(TRAIN))
    assert main(["eval", "intents", "--json", "--train", str(train), "--holdout", "0.2", "--per-intent", "3"]) == 0
    out, progress = capsys.readouterr()
    report = json.loads(out)
    # One of five rows per label held out; three of the other four taught.
    assert (report["n"], report["in_scope"], report["out_of_scope"], report["examples"]) == (3, 3, 0, 9)
    assert report["accuracy"] == 1.0 and report["oos_recall"] is None and report["oos_precision"] is None
    assert isinstance(report["seconds"], float) and "embedding test rows: 3/3" in progress


@pytest.mark.bundled
def test_a_mislabelled_row_and_out_of_scope_queries_give_the_hand_counted_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_csv(tmp_path / "train.csv", rows_of(TRAIN))
    test = write_csv(tmp_path / "test.csv", [
        ("I lost my card", "lost_card"), ("what is today's exchange rate", "exchange_rate"),
        ("what is the limit for top ups", "top_up_limits"), ("I have lost my bank card", "exchange_rate"),  # mislabelled
    ])  # fmt: skip
    report = run(capsys, "--train", train, "--test", test, "--oos", write_clinc(tmp_path / "clinc"))
    # The freeze query is banking, so in scope for a bank and left out: 4 rows + 3 out of scope.
    assert (report["n"], report["in_scope"], report["out_of_scope"]) == (7, 4, 3)
    assert report["accuracy"] == 3 / 4  # the mislabelled row is answered lost_card
    assert (report["oos_recall"], report["oos_precision"], report["oos_confident"]) == (1.0, 1.0, 0.0)
    assert (report["confident_share"], report["confident_accuracy"]) == (1.0, 3 / 4)
    everything_out = run(capsys, "--train", train, "--test", test, "--oos", tmp_path / "clinc" / "data_full_train_val.json", "--in-scope-domains", "utility")
    assert everything_out["out_of_scope"] == 2 + 3  # the three banking queries of `val` now count, the alarm one not


@pytest.mark.bundled
def test_clinc_trains_on_in_scope_train_only_and_tests_on_val_and_oos_val(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clinc = tmp_path / "clinc"
    path = write_clinc(clinc)
    data = json.loads(path.read_text())
    data["val"] = data["val"][:2]  # only intents the train part has
    path.write_text(json.dumps(data))
    report = run(capsys, "--train", path)
    assert (report["n"], report["in_scope"], report["out_of_scope"], report["examples"], report["intents"]) == (3, 2, 1, 15, 3)
    assert (report["accuracy"], report["oos_recall"]) == (1.0, 1.0)


@pytest.mark.bundled
def test_a_bot_is_tested_on_the_rows_it_did_not_learn_with_its_own_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labelled = write_csv(tmp_path / "labelled.csv", rows_of(TRAIN))
    intents = "".join(f"  - name: {name}\n" for name in TRAIN)
    bot = tmp_path / "bot.yaml"
    bot.write_text(f"system_prompt: A bank.\nintents:\n{intents}examples_file: {{path: labelled.csv, per_intent: 3}}\nclassifier: {{threshold: 0.6}}\n")
    report = run(capsys, "--bot", bot, "--train", labelled, "--reject-score", "0.45")
    assert (report["n"], report["examples"], report["accuracy"]) == (6, 9, 1.0)  # the 2 rows per intent beyond the first 3
    assert report["classifier"] == {"nearest_examples": {"threshold": 0.6, "margin": 0.0, "temperature": 0.03, "reject_score": 0.45}}


def test_bad_input_exits_2_naming_the_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clinc = write_clinc(tmp_path / "clinc")
    wrong_header = write_csv(tmp_path / "wrong.csv", [("hello", "greet")], header="sentence,label")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"train": [["fine", "a"]], "val": [["fine", "a"], ["no label"]], "oos_val": []}))
    bot = tmp_path / "bot.yaml"
    bot.write_text("system_prompt: A bank.\nintents:\n  - name: lost_card\n    examples: [I lost my card]\n")
    cases = [
        (["--train", wrong_header], ["wrong.csv", "text,category"]),
        (["--train", tmp_path / "missing.csv"], ["missing.csv", "cannot read"]),
        (["--train", broken], ["broken.json", "field 'val' item 1", "[text, label]"]),
        (["--train", clinc, "--test", broken], ["broken.json", "field 'val' item 1"]),
        (["--train", write_csv(tmp_path / "t.csv", rows_of(TRAIN)), "--oos", tmp_path / "t.csv"], ["t.csv", "CLINC150"]),
        (["--bot", bot, "--test", write_csv(tmp_path / "other.csv", [("hi", "greet")])], ["other.csv", "greet", "no intent of the bot"]),
        (["--bot", tmp_path / "nobot.yaml", "--test", clinc], ["nobot.yaml"]),
        (["--train", clinc, "--temperature", "0"], ["--temperature", "greater than 0"]),
        (["--train", clinc, "--holdout", "0.3"], ["--holdout", "CLINC150"]),
    ]
    for args, words in cases:
        assert main(["eval", "intents", *map(str, args)]) == 2, args
        out, err = capsys.readouterr()
        assert not out and err.startswith("chatcache eval intents: "), (args, err)
        assert all(word in err for word in words), (args, err)

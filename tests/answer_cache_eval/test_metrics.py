"""The eval's metrics on tiny handmade files, with a bag-of-words embedder."""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from chatcache.answer_cache import AnswerCacheConfig
from chatcache.answer_cache.verify import STOPWORDS
from chatcache.evals.answer_cache import evaluate_answer_cache, load_clinc, main_answer_cache, split_questions
from chatcache.evals.answer_cache_pairs import evaluate_pairs, main_pairs
from chatcache.evals.answer_cache_scores import COSINE_STEPS, nearest

DIM = 64
WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti") for b in ("ba", "de", "fo", "gu", "hi", "ja", "ke", "lu")]
_VOCABULARY: dict[str, int] = {}


def bag_embed(texts: list[str]) -> np.ndarray:
    """One hashed axis per word: texts with the same words are identical, shared words raise cosine."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            out[row, sum(map(ord, word)) * 31 % DIM] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def word_embed(texts: list[str]) -> np.ndarray:
    """One axis per distinct word (no hash collisions): cosine is exactly the share of words in common."""
    out = np.zeros((len(texts), 1024), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            out[row, _VOCABULARY.setdefault(word, len(_VOCABULARY))] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "category"])
        writer.writerows(rows)
    return path


TRAIN = [
    ("how do i activate my card", "activate"),
    ("my card was stolen", "stolen"),
    ("what is the exchange rate", "rate"),
]
TEST = [
    ("how do i activate my card please", "activate"),  # hit, right answer
    ("what is the exchange rate for my stolen card", "stolen"),  # between two answers, near neither
    ("my card was not stolen", "lost"),  # close to "stolen", but negated
    ("where is the nearest branch", "branch"),  # nothing near
]


def test_answer_cache_metrics(tmp_path: Path) -> None:
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4)
    result = evaluate_answer_cache(TRAIN, TEST, config, embed=bag_embed, gptcache=False)
    fixed = result["runs"]["fixed"]
    assert (fixed["hits"], fixed["wrong"], fixed["questions"]) == (1, 0, 4)
    assert fixed["hit_rate"] == 0.25 and fixed["error_rate"] == 0.0
    assert fixed["refusals"]["negation differs"] == 1
    # without verification the negated question is served "stolen": a wrong hit
    off = result["runs"]["without_verification"]
    assert (off["hits"], off["wrong"]) == (2, 1) and off["error_rate"] == 0.5
    # the baseline has no verification either
    assert {name for name in result["runs"] if name.startswith("embedding_only@")} == {"embedding_only@0.80", "embedding_only@0.90"}
    baseline = result["runs"]["embedding_only@0.80"]
    assert (baseline["hits"], baseline["wrong"], baseline["hit_rate"]) == (2, 1, 0.5)
    assert result["config"] == {"similarity_threshold": 0.8, "margin": 0.05, "head_confidence": 0.8, "neighbors": 4}


def test_every_interval_holds_its_estimate() -> None:
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4)
    result = evaluate_answer_cache(TRAIN, TEST, config, embed=bag_embed, max_error_rates=[0.05], gptcache=False)
    for name, run in result["runs"].items():
        low, high = run["error_interval"]
        assert low <= run["error_rate"] <= high, name


def test_an_out_of_scope_question_served_anything_is_wrong() -> None:
    """A question no category fits has no right answer; stored, each gets an answer of its own."""
    train = TRAIN + [("play some jazz", "oos"), ("play some blues", "oos")]
    test = [("how can i activate my card", "oos"), ("how do i activate my card please", "activate")]
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4)
    result = evaluate_answer_cache(train, test, config, embed=bag_embed, list_wrong=True, gptcache=False)
    fixed = result["runs"]["fixed"]
    assert (result["oos_questions"], fixed["oos_questions"], fixed["oos_served"]) == (1, 1, 1)
    assert (fixed["hits"], fixed["wrong"], fixed["label_noise"]) == (2, 1, 0)
    [wrong] = fixed["wrong_answers"]
    assert (wrong["question"], wrong["expected"], wrong["served"]) == ("how can i activate my card", "oos", "activate")


def test_a_tiny_train_file_serves_nothing_by_meaning_under_a_bound() -> None:
    """Three stored questions are far too little evidence for any point: exact repeats only."""
    test = TEST + [("How do I activate my card?", "activate")]
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4)
    result = evaluate_answer_cache(TRAIN, test, config, embed=bag_embed, max_error_rates=[0.02, 0.05], gptcache=False)
    assert result["runs"]["fixed"]["hits"] == 2
    for rate in ("0.02", "0.05"):
        bound = result["runs"][f"bound@{rate}"]
        assert bound["hits"] == bound["exact_hits"] == 1
        assert bound["calibration"]["scopes_by_meaning"] == 0
        assert result["runs"][f"embedding_only_calibrated@{rate}"]["calibration"]["threshold"] is None
        assert result["runs"][f"embedding_only_calibrated@{rate}"]["hits"] == 0


def test_a_contradiction_in_the_data_is_label_noise() -> None:
    """The test file files a training question under another answer: served, it is wrong and label noise."""
    test = [("My card was stolen!", "lost"), ("my card was not stolen", "lost")]
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4, verify=False)
    result = evaluate_answer_cache(TRAIN, test, config, embed=bag_embed, gptcache=False)
    fixed = result["runs"]["fixed"]
    assert (fixed["hits"], fixed["wrong"], fixed["label_noise"]) == (2, 2, 1)
    assert fixed["error_rate"] == 1.0 and fixed["error_rate_without_noise"] == 0.5


def test_the_calibrated_baseline_serves_from_its_certified_threshold() -> None:
    """Many well-separated questions certify a threshold; the baseline then serves by it."""
    # a question shares two of three words with its own topic's, one with the other's
    train = [(f"{topic} account {word}{topic}", topic) for topic in ("cards", "loans") for word in WORDS]
    test = [("cards account extra", "cards"), ("loans account extra", "loans"), ("account extra", "cards")]
    result = evaluate_answer_cache(train, test, AnswerCacheConfig(), embed=word_embed, max_error_rates=[0.1], gptcache=False)
    calibrated = result["runs"]["embedding_only_calibrated@0.1"]
    # every step from 0.66 serves each stored question its own topic, none wrongly: the loosest is certified
    assert calibrated["calibration"]["threshold"] == COSINE_STEPS[-1] == 0.5
    assert calibrated["calibration"]["served"] == len(train) >= calibrated["calibration"]["min_evidence"]
    assert calibrated["calibration"]["upper_bound"] <= 0.1
    assert (calibrated["hits"], calibrated["wrong"]) == (2, 0)  # "account extra" is 0.41 from either topic


def test_clinc_parts_are_read_in_order_with_their_out_of_scope_label(tmp_path: Path) -> None:
    path = tmp_path / "clinc.json"
    path.write_text(json.dumps({"train": [["a", "x"]], "oos_train": [["b", "oos"]], "val": [["c", "x"]], "oos_val": []}))
    assert load_clinc(path, ["train", "oos_train"]) == [("a", "x"), ("b", "oos")]
    with pytest.raises(ValueError, match="no part test"):
        load_clinc(path, ["test"])


def test_nearest_finds_the_most_similar_row_and_can_leave_each_out() -> None:
    stored = np.eye(3, dtype=np.float32)
    queries = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]], dtype=np.float32)
    index, best = nearest(stored, queries)
    assert index.tolist() == [0, 1] and best.tolist() == pytest.approx([1.0, 0.8])
    twins = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    index, best = nearest(twins, twins, leave_one_out=True)
    assert index.tolist()[:2] == [1, 0] and best.tolist() == pytest.approx([1.0, 1.0, 0.0])


def write_pairs(tmp_path: Path) -> tuple[Path, Path]:
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(
        "id\tsentence1\tsentence2\tlabel\n"
        "1\tflights from boston to denver\tflights from denver to boston\t0\n"  # swap: refused
        "2\tthe red car is fast\tthe red car is not fast\t0\n"  # negation: refused
        "3\tthe museum opened in 1990 in paris\tthe museum opened in 1990 in paris , france\t0\n"  # a false hit
        "4\tthe film was released in june\tthe film was released in june\t1\n"
        "5\tthe cat sat on the mat\ta dog ran in the park\t1\n",  # too far apart
        encoding="utf-8",
    )
    positives = tmp_path / "positives.json"
    positives.write_text(json.dumps([
        {"index": 0, "origin": "gradio builds demos in python", "similar": "gradio builds demos in python quickly"},
        {"index": 1, "origin": "faiss searches vectors", "similar": "an unrelated sentence entirely"},
    ]))
    return tsv, positives


def test_pair_metrics(tmp_path: Path) -> None:
    tsv, positives = write_pairs(tmp_path)
    config = AnswerCacheConfig(similarity_threshold=0.8)
    result = evaluate_pairs(tsv, positives, config, embed=bag_embed, calibration=(tsv, positives), gptcache=False)
    assert result["pairs"] == {"false_hit_rate": 3, "paws_hit_rate": 2, "positive_hit_rate": 2}
    fixed = result["runs"]["fixed"]
    assert fixed["false_hit_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert fixed["paws_hit_rate"] == 0.5 and fixed["positive_hit_rate"] == 0.5
    assert (fixed["served"], fixed["false_hits"]) == (3, 1) and fixed["error_rate"] == pytest.approx(1 / 3, abs=1e-4)
    low, high = fixed["false_hit_interval"]
    assert low <= fixed["false_hit_rate"] <= high
    assert result["runs"]["without_verification"]["false_hit_rate"] == 1.0
    assert result["runs"]["embedding_only@0.80"]["false_hit_rate"] == 1.0


def synthetic_pairs(tmp_path: Path, name: str, count: int, seed: int) -> tuple[Path, Path]:
    """PAWS-like pairs over made-up words: paraphrases add a word (cosine 0.93), hard negatives
    add two (0.87, and verification passes them), easy negatives replace half the words (0.5)."""
    rng = random.Random(seed)
    vocabulary = [a + b + c for a in "bdgklmnprt" for b in "aeiou" for c in ("ba", "do", "fi", "gu", "ke")]
    vocabulary = [w for w in vocabulary if w not in STOPWORDS]

    def pair(added: int, replaced: int) -> tuple[str, str]:
        words = rng.sample(vocabulary, 6 + added + replaced)  # no word twice in a pair
        return " ".join(words[:6]), " ".join(words[replaced:6] + words[6:])

    lines = ["id\tsentence1\tsentence2\tlabel"]
    for i in range(count):
        kind = i % 5
        (stored, asked), label = (pair(1, 0), 1) if kind < 2 else (pair(2, 0), 0) if kind == 2 else (pair(0, 3), 0)
        lines.append(f"{i}\t{stored}\t{asked}\t{label}")
    tsv = tmp_path / f"{name}.tsv"
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    positives = tmp_path / f"{name}.json"
    rows = [pair(1, 0) for _ in range(count // 10)]
    positives.write_text(json.dumps([{"origin": origin, "similar": similar} for origin, similar in rows]))
    return tsv, positives


def test_the_calibrated_pairs_run_holds_both_risks_on_its_calibration_half(tmp_path: Path) -> None:
    tsv, positives = synthetic_pairs(tmp_path, "pairs", 600, seed=1)
    rate = 0.05
    result = evaluate_pairs(tsv, positives, embed=word_embed, max_error_rates=[rate], confidence=0.9, gptcache=False)
    assert result["calibration"]["pairs"] == {"false_hit_rate": 180, "paws_hit_rate": 120, "positive_hit_rate": 30}
    assert "first half" in result["calibration"]["source"]
    run = result["runs"][f"calibrated@{rate:g}"]
    chosen = run["calibration"]
    assert chosen["point"] is not None and 0.866 < chosen["point"]["threshold"] <= 0.926  # between the two kinds
    assert chosen["false_hits"] / chosen["negatives"] <= rate
    assert chosen["negatives_upper_bound"] <= rate and chosen["error_upper_bound"] <= rate
    # measured on the other half, through the cache at that point: the paraphrases, no negative
    assert (run["paws_hit_rate"], run["positive_hit_rate"], run["false_hits"]) == (1.0, 1.0, 0)
    # the fixed threshold (0.75) serves every hard negative
    assert result["runs"]["fixed"]["false_hit_rate"] == pytest.approx(60 / 180, abs=1e-4)
    # in the product a pair is a one-entry scope, with no evidence: no paraphrase is served
    assert result["runs"][f"product@{rate:g}"]["served"] == 0


def test_with_too_few_calibration_pairs_nothing_is_certified(tmp_path: Path) -> None:
    tsv, positives = synthetic_pairs(tmp_path, "pairs", 40, seed=2)
    result = evaluate_pairs(tsv, positives, embed=word_embed, max_error_rates=[0.01], calibration=(tsv, positives), gptcache=False)
    run = result["runs"]["calibrated@0.01"]
    assert run["calibration"]["point"] is None and run["served"] == 0


def test_split_keeps_every_category_on_both_sides(tmp_path: Path) -> None:
    rows = [(f"question {c} {i}", c) for c in ("a", "b") for i in range(10)]
    train, test = split_questions(write_csv(tmp_path / "all.csv", rows), tmp_path / "split", test_share=0.2, seed=3)
    read = lambda p: list(csv.DictReader(open(p, encoding="utf-8")))  # noqa: E731
    train_rows, test_rows = read(train), read(test)
    assert len(test_rows) == 4 and len(train_rows) == 16
    assert sorted(r["category"] for r in test_rows) == ["a", "a", "b", "b"]
    assert not {r["text"] for r in train_rows} & {r["text"] for r in test_rows}
    again, _ = split_questions(tmp_path / "all.csv", tmp_path / "again", test_share=0.2, seed=3)
    assert read(again) == train_rows


def test_mains_print_one_json_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever the runs (bounds, GPTCache where installed, wrong answers listed), stdout is one JSON object."""
    # Private: the evaluations load the bundled embedder themselves; a bag of words stands in.
    monkeypatch.setattr("chatcache.evals.answer_cache._bundled_embed", bag_embed)
    monkeypatch.setattr("chatcache.evals.answer_cache_pairs._bundled_embed", bag_embed)
    train = write_csv(tmp_path / "train.csv", TRAIN)
    test = write_csv(tmp_path / "test.csv", TEST)
    bounds = ["--max-error-rate", "0.01", "0.02"]
    assert main_answer_cache(["--train", str(train), "--test", str(test), *bounds, "--list-wrong", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["questions"] == 4 and {"bound@0.01", "bound@0.02", "fixed", "gptcache"} <= set(result["runs"])
    clinc = tmp_path / "clinc.json"
    clinc.write_text(json.dumps({"train": [list(row) for row in TRAIN], "oos_train": [["play jazz", "oos"]], "val": [list(TEST[0])], "oos_val": [["sing", "oos"]]}))
    assert main_answer_cache(["--clinc", str(clinc), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["stored"], result["questions"], result["oos_questions"]) == (4, 2, 1)
    tsv, positives = write_pairs(tmp_path)
    assert main_pairs(["--tsv", str(tsv), "--positives", str(positives), *bounds, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"]["paws_hit_rate"] == 1 and {"product@0.01", "calibrated@0.01", "gptcache"} <= set(result["runs"])


def test_mains_refuse_bad_options_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_csv(tmp_path / "train.csv", TRAIN)
    for argv in (
        ["--train", str(train)],
        ["--train", str(train), "--test", str(train), "--clinc", "x.json"],
        ["--train", str(train), "--test", str(train), "--max-error-rate", "0.5"],
        ["--train", str(train), "--test", str(train), "--confidence", "1"],
        ["--clinc", str(train)],  # not CLINC's JSON
    ):
        with pytest.raises(SystemExit) as exited:
            main_answer_cache(argv)
        assert exited.value.code == 2
    with pytest.raises(SystemExit):
        main_pairs(["--tsv", "a.tsv", "--positives", "b.json", "--calibration-tsv", "c.tsv"])
    assert "max_error_rate" in capsys.readouterr().err

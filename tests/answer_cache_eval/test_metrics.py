"""The eval's metrics on tiny handmade files, with a bag-of-words embedder."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from chatcache.answer_cache import AnswerCacheConfig
from chatcache.evals.answer_cache import (
    evaluate_answer_cache,
    evaluate_pairs,
    main_answer_cache,
    main_pairs,
    nearest_answers,
    split_questions,
)

DIM = 64


def bag_embed(texts: list[str]) -> np.ndarray:
    """One hashed axis per word: texts with the same words are identical, shared words raise cosine."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            out[row, sum(map(ord, word)) * 31 % DIM] += 1.0
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
    train = write_csv(tmp_path / "train.csv", TRAIN)
    test = write_csv(tmp_path / "test.csv", TEST)
    config = AnswerCacheConfig(similarity_threshold=0.8, margin=0.05, neighbors=4)
    result = evaluate_answer_cache(train, test, config, embed=bag_embed)
    assert (result["hits"], result["correct"], result["questions"]) == (1, 1, 4)
    assert result["hit_rate"] == 0.25 and result["precision"] == 1.0
    assert result["refusals"]["negation differs"] == 1
    # without verification the negated question is served "stolen": a wrong hit
    off = result["without_verification"]
    assert (off["hits"], off["correct"]) == (2, 1) and off["precision"] == 0.5
    # the baseline has no verification either
    assert set(result["embedding_only"]) == {"0.80", "0.90"}
    baseline = result["embedding_only"]["0.80"]
    assert (baseline["hits"], baseline["correct"], baseline["hit_rate"]) == (2, 1, 0.5)
    assert result["config"] == {"similarity_threshold": 0.8, "margin": 0.05, "neighbors": 4}


def test_nearest_answers_needs_the_threshold() -> None:
    stored = np.eye(3, dtype=np.float32)
    queries = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]], dtype=np.float32)
    assert nearest_answers(stored, ["a", "b", "c"], queries, 0.7) == ["a", "b"]
    assert nearest_answers(stored, ["a", "b", "c"], queries, 0.9) == ["a", None]


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
    result = evaluate_pairs(tsv, positives, config, embed=bag_embed)
    assert result["pairs"] == {"false_hit_rate": 3, "paws_hit_rate": 2, "positive_hit_rate": 2}
    assert result["false_hit_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert result["paws_hit_rate"] == 0.5
    assert result["positive_hit_rate"] == 0.5
    assert result["without_verification"]["false_hit_rate"] == 1.0
    assert result["embedding_only"]["0.80"]["false_hit_rate"] == 1.0


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
    monkeypatch.setattr("chatcache.evals.answer_cache._bundled_embed", bag_embed)
    train = write_csv(tmp_path / "train.csv", TRAIN)
    test = write_csv(tmp_path / "test.csv", TEST)
    assert main_answer_cache(["--train", str(train), "--test", str(test), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 4
    tsv, positives = write_pairs(tmp_path)
    assert main_pairs(["--tsv", str(tsv), "--positives", str(positives), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"]["paws_hit_rate"] == 2

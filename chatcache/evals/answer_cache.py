"""Measure the answer cache on labelled questions: `chatcache eval answer-cache` and `eval pairs`.

`evaluate_answer_cache` warms a real in-memory `AnswerCache` with training questions (each
question's intent label stands in for the model's answer) and replays held-out questions: a
hit is correct when the served label is the question's own. `evaluate_pairs` asks, for one
pair at a time in a fresh cache, whether the second sentence is served the first's answer:
on non-paraphrases (PAWS label 0) every hit is a false hit, on paraphrases (PAWS label 1,
GPTCache's mock pairs) a hit is what we want.

Both report the same run with verification off, so what the checks cost in hits is visible,
and an embedding-only baseline (what GPTCache does: the nearest cached question above a
cosine threshold, no answer vote, no margin, no verification). Texts are embedded once, in
batches, and the vectors passed to the cache. This module does not split data: pass a train
and a test file you keep apart (`split_questions` writes a stratified split).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..answer_cache import AnswerCache, AnswerCacheConfig, Scope

Embed = Callable[[list[str]], np.ndarray]
SCOPE = Scope("eval", "eval")
BASELINE_THRESHOLD = 0.9  # GPTCache's usual cosine cut-off, reported beside the main threshold
_ENTROPY_BITS = 0.0
_LATENCY_MS = 100.0


def load_questions(path: str | Path) -> list[tuple[str, str]]:
    """(text, category) rows of a CSV with a `text,category` header."""
    with open(path, encoding="utf-8", newline="") as f:
        return [(row["text"], row["category"]) for row in csv.DictReader(f)]


def load_pairs(path: str | Path) -> list[tuple[str, str, int]]:
    """(sentence1, sentence2, label) rows of a PAWS TSV with an `id sentence1 sentence2 label` header."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    header = lines[0].split("\t")
    s1, s2, label = header.index("sentence1"), header.index("sentence2"), header.index("label")
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    return [(r[s1], r[s2], int(r[label])) for r in rows]


def load_positives(path: str | Path) -> list[tuple[str, str]]:
    """(origin, similar) pairs of a GPTCache mock-data JSON list."""
    with open(path, encoding="utf-8") as f:
        return [(p["origin"], p["similar"]) for p in json.load(f)]


def split_questions(
    path: str | Path, out_dir: str | Path, test_share: float = 0.2, seed: int = 0
) -> tuple[Path, Path]:
    """Write `train.csv` and `test.csv` under `out_dir`: `test_share` of every category, shuffled by `seed`."""
    by_category: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for text, category in load_questions(path):
        by_category[category].append((text, category))
    train, test = [], []
    for category in sorted(by_category):
        rows = by_category[category]
        random.Random(f"{category}:{seed}").shuffle(rows)
        n = round(len(rows) * test_share)
        test += rows[:n]
        train += rows[n:]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.csv", out / "test.csv"
    for target, rows in zip(paths, (train, test)):
        with open(target, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "category"])
            writer.writerows(rows)
    return paths


def evaluate_answer_cache(
    train_csv: str | Path,
    test_csv: str | Path,
    config: AnswerCacheConfig | None = None,
    embed: Embed | None = None,
) -> dict[str, Any]:
    """Warm the cache with the training questions, replay the test questions.

    Args:
        train_csv, test_csv: `text,category` files; the category stands in for the answer.
        config: the cache's settings; defaults to `AnswerCacheConfig()`.
        embed: texts -> unit rows; defaults to the bundled MiniLM on CPU.

    Returns:
        hit_rate, precision, hits, questions, refusals, and the same metrics under
        "without_verification" and "without_heads" (the vote alone); "embedding_only" holds
        the baseline per threshold.
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    train, test = load_questions(train_csv), load_questions(test_csv)
    train_vectors = _unit(embed([t for t, _ in train]))
    test_vectors = _unit(embed([t for t, _ in test]))
    result: dict[str, Any] = {}
    runs = (
        ("main", config),
        ("without_verification", replace(config, verify=False)),
        ("without_heads", replace(config, head_confidence=None)),
    )
    for key, run_config in runs:
        cache = AnswerCache(run_config, embed)
        for (text, category), vector in zip(train, train_vectors):
            cache.store(text, category, SCOPE, _ENTROPY_BITS, _LATENCY_MS, embedding=vector)
        cache.calibrate()
        served = []
        for (text, _), vector in zip(test, test_vectors):
            hit = cache.lookup(text, SCOPE, embedding=vector)
            served.append(hit.answer if hit else None)
        metrics = _served_metrics(served, [c for _, c in test])
        if key == "main":
            stats = cache.snapshot()
            result.update(metrics)
            result["refusals"] = {"ambiguous": stats.refused_as_ambiguous, "head": stats.refused_by_head, **stats.refusal_reasons}
        else:
            result[key] = metrics
    result["embedding_only"] = {
        f"{t:.2f}": _served_metrics(nearest_answers(train_vectors, [c for _, c in train], test_vectors, t), [c for _, c in test])
        for t in sorted({config.similarity_threshold, BASELINE_THRESHOLD})
    }
    result["config"] = _config_summary(config)
    return result


def evaluate_pairs(
    tsv: str | Path,
    positives_json: str | Path,
    config: AnswerCacheConfig | None = None,
    embed: Embed | None = None,
) -> dict[str, Any]:
    """One fresh cache per pair: the first sentence stored, the second looked up.

    Returns:
        false_hit_rate (PAWS label 0), paws_hit_rate (PAWS label 1), positive_hit_rate
        (GPTCache pairs), counts, the same rates under "without_verification", and under
        "embedding_only" the baseline's rates per threshold.
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    paws = load_pairs(tsv)
    groups = {
        "false_hit_rate": [(a, b) for a, b, label in paws if label == 0],
        "paws_hit_rate": [(a, b) for a, b, label in paws if label == 1],
        "positive_hit_rate": load_positives(positives_json),
    }
    texts = sorted({text for pairs in groups.values() for pair in pairs for text in pair})
    vectors = dict(zip(texts, _unit(embed(texts))))
    result: dict[str, Any] = {}
    for key, run_config in (("main", config), ("without_verification", replace(config, verify=False))):
        rates = {name: round(float(np.mean(pair_hits(pairs, vectors, run_config, embed))), 4) for name, pairs in groups.items()}
        if key == "main":
            result.update(rates)
        else:
            result[key] = rates
    result["pairs"] = {name: len(pairs) for name, pairs in groups.items()}
    result["embedding_only"] = {
        f"{t:.2f}": {
            name: round(float(np.mean([vectors[a] @ vectors[b] >= t for a, b in pairs])), 4) for name, pairs in groups.items()
        }
        for t in sorted({config.similarity_threshold, BASELINE_THRESHOLD})
    }
    result["config"] = _config_summary(config)
    return result


def pair_hits(
    pairs: Sequence[tuple[str, str]], vectors: dict[str, np.ndarray], config: AnswerCacheConfig, embed: Embed
) -> list[bool]:
    """Whether each pair's second text is served the answer stored for its first."""
    hits = []
    for stored, asked in pairs:
        cache = AnswerCache(config, embed)
        cache.store(stored, "answer", SCOPE, _ENTROPY_BITS, _LATENCY_MS, embedding=vectors[stored])
        hits.append(cache.lookup(asked, SCOPE, embedding=vectors[asked]) is not None)
    return hits


def nearest_answers(
    stored: np.ndarray, answers: Sequence[str], queries: np.ndarray, threshold: float
) -> list[str | None]:
    """The embedding-only baseline: the nearest stored question's answer when it clears `threshold`."""
    if len(stored) == 0:
        return [None] * len(queries)
    similarities = queries @ stored.T
    nearest = similarities.argmax(axis=1)
    best = similarities[np.arange(len(queries)), nearest]
    return [answers[j] if s >= threshold else None for j, s in zip(nearest, best)]


def _served_metrics(served: Sequence[str | None], truth: Sequence[str]) -> dict[str, Any]:
    hits = sum(answer is not None for answer in served)
    correct = sum(answer == expected for answer, expected in zip(served, truth) if answer is not None)
    return {
        "hit_rate": round(hits / len(truth), 4) if truth else 0.0,
        "precision": round(correct / hits, 4) if hits else 0.0,
        "hits": hits,
        "correct": correct,
        "questions": len(truth),
    }


def _config_summary(config: AnswerCacheConfig) -> dict[str, Any]:
    return {"similarity_threshold": config.similarity_threshold, "margin": config.margin, "neighbors": config.neighbors}


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        return x.reshape(0, 0)
    unit: np.ndarray = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return unit


def _bundled_embed(texts: list[str]) -> np.ndarray:
    from ..steering.hcac import sentence_embed
    from ..model.loading import load_embedder

    return sentence_embed(load_embedder("bundled", device="cpu"))(texts)


def main_answer_cache(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval answer-cache --train FILE.csv --test FILE.csv [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval answer-cache", description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="questions that warm the cache, CSV text,category")
    parser.add_argument("--test", required=True, help="questions replayed against it, CSV text,category")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    return _report(
        evaluate_answer_cache(args.train, args.test),
        args.json,
        lambda row: f"hit_rate={row['hit_rate']:.3f} precision={row['precision']:.4f} hits={row['hits']}/{row['questions']}",
    )


def main_pairs(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval pairs --tsv FILE.tsv --positives FILE.json [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval pairs", description=__doc__.splitlines()[0])
    parser.add_argument("--tsv", required=True, help="PAWS pairs, TSV id,sentence1,sentence2,label")
    parser.add_argument("--positives", required=True, help="GPTCache mock pairs, JSON list of origin/similar")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    return _report(
        evaluate_pairs(args.tsv, args.positives),
        args.json,
        lambda row: f"false_hit_rate={row['false_hit_rate']:.3f} paws_hit_rate={row['paws_hit_rate']:.3f} "
        f"positive_hit_rate={row['positive_hit_rate']:.3f}",
    )


def _report(result: dict[str, Any], as_json: bool, line: Callable[[dict[str, Any]], str]) -> int:
    """One JSON object, or a line per configuration: the cache, without verification (and without
    answer heads, where the evaluation has them), embedding-only."""
    if as_json:
        print(json.dumps(result))
        return 0
    rows = [("cache", result), ("no verify", result["without_verification"])]
    if "without_heads" in result:
        rows.append(("no heads", result["without_heads"]))
    rows += [(f"emb-only {t}", row) for t, row in result["embedding_only"].items()]
    for name, row in rows:
        print(f"{name:16} {line(row)}")
    return 0

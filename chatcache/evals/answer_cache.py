"""Measure the answer cache on labelled questions: `chatcache eval answer-cache` and `eval pairs`.

``evaluate_answer_cache` warms a real in-memory `AnswerCache` with training questions (each
question's category stands in for the model's answer) and replays held-out questions: a hit is
right when the served answer is the question's own category. A question labelled out of scope
(`--oos-label`) has no right answer: anything served to it is wrong; stored, each gets an answer
of its own, as each would get its own reply from the model. `evaluate_pairs` asks, for one pair
at a time in a fresh cache, whether the second sentence is served the first's answer: on
non-paraphrases (PAWS label 0) every hit is wrong, on paraphrases (PAWS label 1, GPTCache's mock
pairs) a hit is what we want.

Every run of one call sees the same vectors (texts are embedded once, in batches): the cache
under a bound for each `--max-error-rate` D (`bound@D`: calibrated on what it stores, then
replayed), today's fixed configuration, the cache without verification (and without answer
heads), the embedding-only baseline at fixed cosine thresholds and at the one its own
leave-one-out trials certify for D, and GPTCache's default similar cache. Errors are reported
with a two-sided exact interval and, by a rule stated in `answer_cache_scores`, without the
training data's own contradictions (label noise).

This module splits no data beyond `split_questions` (a stratified split written to files): pass
a train and a test file you keep apart. CLINC150's JSON is read as it is (`--clinc`), its parts
named on the command line. The pairs are in `answer_cache_pairs`.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..answer_cache import AnswerCache, AnswerCacheConfig, Scope
from ..errors import ConfigError
from . import gptcache_peer
from .answer_cache_scores import LabelNoise, Row, certified_cosine, nearest, score_served

Embed = Callable[[list[str]], np.ndarray]
SCOPE = Scope("eval", "eval")
BASELINE_THRESHOLD = 0.9  # GPTCache's usual cosine cut-off, reported beside the cache's own threshold
OOS_LABEL = "oos"  # CLINC150's out-of-scope category
CLINC_TRAIN, CLINC_TEST = ("train", "oos_train"), ("val", "oos_val")
ENTROPY_BITS = 0.0  # what every stored answer is said to have cost: under every entropy gate
LATENCY_MS = 100.0


def load_questions(path: str | Path) -> list[Row]:
    """(text, category) rows of a CSV with a `text,category` header."""
    with open(path, encoding="utf-8", newline="") as f:
        return [(row["text"], row["category"]) for row in csv.DictReader(f)]


def load_clinc(path: str | Path, parts: Sequence[str]) -> list[Row]:
    """(text, category) rows of CLINC150's JSON (`data_full.json`, or `data_full_train_val.json`
    without the test parts): the lists named by `parts`, in order; out-of-scope rows keep "oos"."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    missing = [part for part in parts if part not in data]
    if missing:
        raise ValueError(f"{path}: no part {', '.join(missing)} (it has {', '.join(sorted(data))})")
    return [(text, category) for part in parts for text, category in data[part]]


def split_questions(
    path: str | Path, out_dir: str | Path, test_share: float = 0.2, seed: int = 0
) -> tuple[Path, Path]:
    """Write `train.csv` and `test.csv` under `out_dir`: `test_share` of every category, shuffled by `seed`."""
    by_category: dict[str, list[Row]] = defaultdict(list)
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
    train: Sequence[Row],
    test: Sequence[Row],
    config: AnswerCacheConfig | None = None,
    embed: Embed | None = None,
    max_error_rates: Sequence[float] = (),
    confidence: float = 0.95,
    oos_label: str = OOS_LABEL,
    list_wrong: bool = False,
    gptcache: bool = True,
) -> dict[str, Any]:
    """Warm each run with the training questions, replay the test questions.

    Args:
        train, test: (text, category) rows; the category stands in for the answer.
        config: the fixed configuration; `bound@D` runs are it with `max_error_rate` D.
        embed: texts -> unit rows; defaults to the bundled MiniLM on CPU.
        max_error_rates: one `bound@D` and one `embedding_only_calibrated@D` run per D.
        confidence: of every bound and interval.
        oos_label: the category of questions with no right answer.
        list_wrong: every run lists its wrong answers (`score_served`).
        gptcache: run GPTCache beside the cache (skipped with a message where it is not installed).

    Returns:
        questions, oos_questions, stored; under "runs", per run the metrics of `score_served`
        (the cache's runs add exact_hits and refusals, bound runs their calibration, the
        calibrated baseline its threshold); the fixed configuration under "config".
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    # An out-of-scope question stored gets an answer of its own: the model would answer each anew.
    stored = [(text, f"{oos_label}:{i}" if category == oos_label else category) for i, (text, category) in enumerate(train)]
    train_vectors = _unit(embed([t for t, _ in train]))
    test_vectors = _unit(embed([t for t, _ in test]))
    noise = LabelNoise(stored)

    def scored(served: Sequence[str | None], via: Sequence[str | None] | None) -> dict[str, Any]:
        return score_served(served, test, oos_label, noise, confidence, via, list_wrong)

    def cache_run(run_config: AnswerCacheConfig) -> dict[str, Any]:
        cache = AnswerCache(run_config, embed)
        for (text, answer), vector in zip(stored, train_vectors):
            cache.store(text, answer, SCOPE, ENTROPY_BITS, LATENCY_MS, embedding=vector)
        cache.calibrate()
        hits = [cache.lookup(text, SCOPE, embedding=vector) for (text, _), vector in zip(test, test_vectors)]
        result = scored([h.answer if h else None for h in hits], [h.question if h else None for h in hits])
        stats = cache.snapshot()
        result["exact_hits"] = stats.exact_hits
        result["refusals"] = {
            "ambiguous": stats.refused_as_ambiguous,
            "head": stats.refused_by_head,
            "without_evidence": stats.refused_without_evidence,
            **stats.refusal_reasons,
        }
        if run_config.max_error_rate is not None:
            calibration = cache.calibration(SCOPE)
            result["calibration"] = {
                "scopes_by_meaning": stats.scopes_by_meaning,
                "scopes_exact_only": stats.scopes_exact_only,
                **({} if calibration is None else {**asdict(calibration), "point": calibration.point and asdict(calibration.point)}),
            }
        return result

    runs: dict[str, Any] = {}
    for rate in max_error_rates:
        runs[f"bound@{rate:g}"] = cache_run(replace(config, max_error_rate=rate, bound_confidence=confidence))
    runs["fixed"] = cache_run(config)
    runs["without_verification"] = cache_run(replace(config, verify=False))
    runs["without_heads"] = cache_run(replace(config, head_confidence=None))
    index, best = nearest(train_vectors, test_vectors)

    def embedding_only(threshold: float | None) -> dict[str, Any]:
        served = [threshold is not None and similarity >= threshold for similarity in best]
        return scored(
            [stored[j][1] if ok else None for j, ok in zip(index, served)],
            [stored[j][0] if ok else None for j, ok in zip(index, served)],
        )

    for threshold in baseline_thresholds(config):
        runs[f"embedding_only@{threshold:.2f}"] = embedding_only(threshold)
    for rate in max_error_rates:
        certified = certified_cosine(train_vectors, [a for _, a in stored], rate, confidence)
        runs[f"embedding_only_calibrated@{rate:g}"] = {**embedding_only(certified["threshold"]), "calibration": certified}
    if gptcache:
        runs["gptcache"] = _gptcache_questions(stored, test, train_vectors, test_vectors, scored)
    return {
        "questions": len(test),
        "oos_questions": sum(category == oos_label for _, category in test),
        "stored": len(train),
        "confidence": confidence,
        "runs": runs,
        "config": config_summary(config),
    }


def _gptcache_questions(
    stored: Sequence[Row],
    test: Sequence[Row],
    train_vectors: np.ndarray,
    test_vectors: np.ndarray,
    scored: Callable[[Sequence[str | None], Sequence[str | None] | None], dict[str, Any]],
) -> dict[str, Any]:
    if not gptcache_peer.available():
        print(gptcache_peer.MISSING, file=sys.stderr)
        return {"skipped": gptcache_peer.MISSING}
    vectors = dict(zip([t for t, _ in stored], train_vectors)) | dict(zip([t for t, _ in test], test_vectors))
    return scored(gptcache_peer.served_answers(stored, [t for t, _ in test], vectors), None)


def baseline_thresholds(config: AnswerCacheConfig) -> list[float]:
    """The embedding-only baseline's fixed thresholds: the cache's own, and GPTCache's usual one."""
    return sorted({config.similarity_threshold, BASELINE_THRESHOLD})


def config_summary(config: AnswerCacheConfig) -> dict[str, Any]:
    return {
        "similarity_threshold": config.similarity_threshold,
        "margin": config.margin,
        "head_confidence": config.head_confidence,
        "neighbors": config.neighbors,
    }


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


def check_rates(parser: argparse.ArgumentParser, rates: Sequence[float], confidence: float) -> None:
    """Exit through `parser` (status 2) on an error rate or confidence the cache would refuse."""
    checked: list[float | None] = [*rates] or [None]  # the confidence alone, when no rate is given
    for rate in checked:
        try:
            AnswerCacheConfig(max_error_rate=rate, bound_confidence=confidence)
        except ConfigError as exc:
            parser.error(str(exc))


def main_answer_cache(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval answer-cache (--train FILE.csv --test FILE.csv | --clinc FILE.json) [--max-error-rate D ...] [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval answer-cache", description=__doc__.splitlines()[0])
    parser.add_argument("--train", help="questions that warm the cache, CSV text,category")
    parser.add_argument("--test", help="questions replayed against it, CSV text,category")
    parser.add_argument("--clinc", help="instead of --train and --test: CLINC150's JSON (data_full.json or the train/val file)")
    parser.add_argument("--train-parts", default=",".join(CLINC_TRAIN), help="with --clinc, the parts stored (default %(default)s)")
    parser.add_argument("--test-parts", default=",".join(CLINC_TEST), help="with --clinc, the parts replayed (default %(default)s)")
    parser.add_argument("--max-error-rate", type=float, nargs="+", default=[], metavar="D", help="a bound@D and an embedding_only_calibrated@D run per D")
    parser.add_argument("--confidence", type=float, default=0.95, help="of the bounds and intervals (default 0.95)")
    parser.add_argument("--oos-label", default=OOS_LABEL, help="the category of out-of-scope questions (default %(default)s)")
    parser.add_argument("--list-wrong", action="store_true", help="list every wrong answer served, with its label-noise flag")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.clinc and (args.train or args.test):
        parser.error("--clinc replaces --train and --test")
    if not args.clinc and not (args.train and args.test):
        parser.error("give --train and --test, or --clinc")
    check_rates(parser, args.max_error_rate, args.confidence)
    if args.clinc:
        try:
            train, test = load_clinc(args.clinc, args.train_parts.split(",")), load_clinc(args.clinc, args.test_parts.split(","))
        except (OSError, ValueError) as exc:  # a missing file or part, or not JSON
            parser.error(str(exc))
    else:
        train, test = load_questions(args.train), load_questions(args.test)
    result = evaluate_answer_cache(
        train, test, max_error_rates=args.max_error_rate, confidence=args.confidence, oos_label=args.oos_label,
        list_wrong=args.list_wrong,
    )  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['questions']} questions ({result['oos_questions']} out of scope), {result['stored']} stored; "
        f"error among answers served [{args.confidence:.0%} interval], and without label noise"
    )
    for name, run in result["runs"].items():
        print(f"{name:32} {_run_line(run)}")
        for wrong in run.get("wrong_answers", []):
            flag = " [label noise]" if wrong["label_noise"] else ""
            via = f" (via {wrong['via']!r})" if wrong["via"] is not None else ""
            print(f"    {wrong['question']!r}: {wrong['expected']}, served {wrong['served']}{via}{flag}")
    return 0


def _run_line(run: dict[str, Any]) -> str:
    if "skipped" in run:
        return str(run["skipped"])
    low, high = run["error_interval"]
    line = (
        f"hit_rate={run['hit_rate']:.3f} error={run['error_rate']:.4f} [{low:.4f}, {high:.4f}] "
        f"hits={run['hits']}/{run['questions']} oos_served={run['oos_served']}/{run['oos_questions']} "
        f"noise={run['label_noise']} error_without_noise={run['error_rate_without_noise']:.4f}"
    )
    calibration = run.get("calibration", {})
    if "scopes_by_meaning" in calibration:
        line += f" scopes_by_meaning={calibration['scopes_by_meaning']} exact_only={calibration['scopes_exact_only']}"
    if "threshold" in calibration:
        line += f" threshold={calibration['threshold']}"
    return line

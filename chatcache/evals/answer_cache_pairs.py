"""Measure the answer cache on sentence pairs: `chatcache eval pairs`.

For one pair at a time, a fresh cache holds the first sentence and is asked the second: on
non-paraphrases (PAWS label 0) a hit is a wrong answer, on paraphrases (PAWS label 1, GPTCache's
mock pairs) a hit is what we want.

Under a bound the product serves a pair nothing by meaning: a one-entry scope has no evidence,
so it serves exact repeats only (`product@D`). What a bound could buy on pairs is shown by
`calibrated@D`: one-entry scopes at the step of `decision.PATH` that calibration pairs certify
(`answer_cache_scores.certified_pair_point`), measured through the real cache at that point.
Calibration pairs are given files, or else the first half of each measured file, the runs then
measured on the second half (the halves the verifier's near-copy rule was tuned and checked on).
Beside them, in the same call and on the same vectors: the fixed configuration, the cache
without verification, embedding-only cosine thresholds and GPTCache's default similar cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..answer_cache import AnswerCache, AnswerCacheConfig
from ..answer_cache.bound import interval
from ..answer_cache.decision import PATH
from . import gptcache_peer
from .answer_cache import (
    ENTROPY_BITS,
    LATENCY_MS,
    SCOPE,
    Embed,
    _bundled_embed,
    check_rates,
    baseline_thresholds,
    config_summary,
    _unit,
)
from .answer_cache_scores import PairTrial, certified_pair_point, pair_rank

Pairs = dict[str, list[tuple[str, str]]]


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


def pair_groups(tsv: str | Path, positives_json: str | Path) -> Pairs:
    """The pairs by what a hit on them means: PAWS negatives (wrong), PAWS and GPTCache paraphrases (right)."""
    paws = load_pairs(tsv)
    return {
        "false_hit_rate": [(a, b) for a, b, label in paws if label == 0],
        "paws_hit_rate": [(a, b) for a, b, label in paws if label == 1],
        "positive_hit_rate": load_positives(positives_json),
    }


def evaluate_pairs(
    tsv: str | Path,
    positives_json: str | Path,
    config: AnswerCacheConfig | None = None,
    embed: Embed | None = None,
    max_error_rates: Sequence[float] = (),
    confidence: float = 0.95,
    calibration: tuple[str | Path, str | Path] | None = None,
    gptcache: bool = True,
) -> dict[str, Any]:
    """Every run over the same pairs and vectors.

    Args:
        tsv, positives_json: the pairs measured (PAWS TSV, GPTCache mock pairs).
        config: the fixed configuration; the bounded runs are it with `max_error_rate` D.
        embed: texts -> unit rows; defaults to the bundled MiniLM on CPU.
        max_error_rates: one `product@D` and one `calibrated@D` run per D.
        confidence: of every bound and interval.
        calibration: (PAWS TSV, GPTCache pairs) that `calibrated@D` chooses its point on; None
            calibrates on the first half of each measured file and measures on the second.
        gptcache: run GPTCache beside the cache (skipped with a message where it is not installed).

    Returns:
        pairs (measured, per group), calibration (where its pairs came from, and how many) and
        under "runs", per run: false_hit_rate (PAWS negatives served) with its interval,
        paws_hit_rate, positive_hit_rate (GPTCache pairs), served, false_hits, and error_rate
        (false hits among all pairs served) with its interval; `calibrated@D` adds the
        certified point and its evidence.
    """
    config = config or AnswerCacheConfig()
    embed = embed or _bundled_embed
    groups = pair_groups(tsv, positives_json)
    if calibration is None:
        calibrating = {name: pairs[: len(pairs) // 2] for name, pairs in groups.items()}
        groups = {name: pairs[len(pairs) // 2 :] for name, pairs in groups.items()}
        source = "the first half of each file given (in file order); every run is measured on the second half"
    else:
        calibrating = pair_groups(*calibration)
        source = f"{calibration[0]} and {calibration[1]}"
    texts = sorted({text for part in (groups, calibrating) for pairs in part.values() for pair in pairs for text in pair})
    vectors = dict(zip(texts, _unit(embed(texts))))

    def cache_run(run_config: AnswerCacheConfig) -> dict[str, Any]:
        return _pair_metrics({name: pair_hits(pairs, vectors, run_config, embed) for name, pairs in groups.items()}, confidence)

    trials = [
        PairTrial(name != "false_hit_rate", pair_rank(a, b, float(vectors[a] @ vectors[b]), config.verify))
        for name, pairs in calibrating.items()
        for a, b in pairs
    ]
    runs: dict[str, Any] = {}
    for rate in max_error_rates:
        runs[f"product@{rate:g}"] = cache_run(replace(config, max_error_rate=rate, bound_confidence=confidence))
        chosen = certified_pair_point(trials, rate, confidence)
        if chosen["step"] is None:
            nothing = {name: [False] * len(pairs) for name, pairs in groups.items()}
            runs[f"calibrated@{rate:g}"] = {**_pair_metrics(nothing, confidence), "calibration": chosen}
        else:
            point = PATH[chosen["step"]]
            at_point = replace(config, similarity_threshold=point.threshold, margin=point.margin, head_confidence=point.head_confidence)
            runs[f"calibrated@{rate:g}"] = {**cache_run(at_point), "calibration": chosen}
    runs["fixed"] = cache_run(config)
    runs["without_verification"] = cache_run(replace(config, verify=False))
    for threshold in baseline_thresholds(config):
        runs[f"embedding_only@{threshold:.2f}"] = _pair_metrics(
            {name: [bool(vectors[a] @ vectors[b] >= threshold) for a, b in pairs] for name, pairs in groups.items()},
            confidence,
        )
    if gptcache:
        if gptcache_peer.available():
            hits = {name: gptcache_peer.pair_hits(pairs, vectors) for name, pairs in groups.items()}
            runs["gptcache"] = _pair_metrics(hits, confidence)
        else:
            print(gptcache_peer.MISSING, file=sys.stderr)
            runs["gptcache"] = {"skipped": gptcache_peer.MISSING}
    return {
        "pairs": {name: len(pairs) for name, pairs in groups.items()},
        "calibration": {"source": source, "pairs": {name: len(pairs) for name, pairs in calibrating.items()}},
        "confidence": confidence,
        "runs": runs,
        "config": config_summary(config),
    }


def pair_hits(
    pairs: Sequence[tuple[str, str]], vectors: dict[str, np.ndarray], config: AnswerCacheConfig, embed: Embed
) -> list[bool]:
    """Whether each pair's second text is served the answer stored for its first, by a fresh cache."""
    hits = []
    for stored, asked in pairs:
        cache = AnswerCache(config, embed)
        cache.store(stored, "answer", SCOPE, ENTROPY_BITS, LATENCY_MS, embedding=vectors[stored])
        hits.append(cache.lookup(asked, SCOPE, embedding=vectors[asked]) is not None)
    return hits


def _pair_metrics(hits: dict[str, list[bool]], confidence: float) -> dict[str, Any]:
    """Per group the share served; false hits (served negatives) among the negatives and among all served."""
    false_hits = sum(hits["false_hit_rate"])
    served = sum(sum(group) for group in hits.values())
    result: dict[str, Any] = {name: round(float(np.mean(group)), 4) if group else 0.0 for name, group in hits.items()}
    result.update(
        false_hit_interval=[round(end, 5) for end in interval(false_hits, len(hits["false_hit_rate"]), confidence)],
        served=served,
        false_hits=false_hits,
        error_rate=round(false_hits / served, 5) if served else 0.0,
        error_interval=[round(end, 5) for end in interval(false_hits, served, confidence)],
    )
    return result


def main_pairs(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval pairs --tsv FILE.tsv --positives FILE.json [--max-error-rate D ...] [--json]`."""
    parser = argparse.ArgumentParser(prog="chatcache eval pairs", description=__doc__.splitlines()[0])
    parser.add_argument("--tsv", required=True, help="PAWS pairs, TSV id,sentence1,sentence2,label")
    parser.add_argument("--positives", required=True, help="GPTCache mock pairs, JSON list of origin/similar")
    parser.add_argument("--max-error-rate", type=float, nargs="+", default=[], metavar="D", help="a product@D and a calibrated@D run per D")
    parser.add_argument("--confidence", type=float, default=0.95, help="of the bounds and intervals (default 0.95)")
    parser.add_argument("--calibration-tsv", help="PAWS pairs calibrated@D chooses its point on (default: half of --tsv)")
    parser.add_argument("--calibration-positives", help="GPTCache pairs for the same (with --calibration-tsv)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if (args.calibration_tsv is None) != (args.calibration_positives is None):
        parser.error("give both --calibration-tsv and --calibration-positives, or neither")
    check_rates(parser, args.max_error_rate, args.confidence)
    calibration = (args.calibration_tsv, args.calibration_positives) if args.calibration_tsv else None
    result = evaluate_pairs(
        args.tsv, args.positives, max_error_rates=args.max_error_rate, confidence=args.confidence, calibration=calibration
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"pairs measured: {result['pairs']}; calibration pairs: {result['calibration']['source']}")
    print(f"rates: negatives served [{args.confidence:.0%} interval], paraphrases served (PAWS, GPTCache), error among served")
    for name, run in result["runs"].items():
        print(f"{name:24} {_pair_line(run)}")
    return 0


def _pair_line(run: dict[str, Any]) -> str:
    if "skipped" in run:
        return str(run["skipped"])
    low, high = run["false_hit_interval"]
    line = (
        f"negatives={run['false_hit_rate']:.4f} [{low:.4f}, {high:.4f}] paws={run['paws_hit_rate']:.3f} "
        f"gptcache={run['positive_hit_rate']:.3f} error={run['error_rate']:.4f} served={run['served']}"
    )
    if "calibration" in run:
        point = run["calibration"]["point"]
        line += " point=" + ("none certified" if point is None else "{threshold}/{margin}/{head_confidence}".format(**point))
    return line

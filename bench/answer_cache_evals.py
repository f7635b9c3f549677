"""Hit rate and precision of the answer cache on labelled data, as `chatcache eval` reports them.

Splits the BANKING77 training file 80/20 per category (fixed seed) into a scratch folder,
then runs `eval answer-cache` on it and `eval pairs` on PAWS and the GPTCache pairs, all with
the default configuration and the bundled MiniLM embedder; then GPTCache itself (PyPI
`gptcache`, `chatcache/evals/gptcache_peer.py`) on the same split, pairs and vectors.

    python -m bench.answer_cache_evals [--data ../shared/data] [--out bench/out] [--quick]

About 12 minutes on 2 CPU cores (embedding 10,000 questions and 16,000 sentences, a cache per
pair; GPTCache's 9 of them, a cache per pair on disk); --quick (every fifth BANKING77 question,
the first 1,500 PAWS pairs) about 3 minutes. Results are
written to bench/out/answer_cache_evals.json as each evaluation finishes.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from chatcache.evals.answer_cache import (
    _bundled_embed,
    _served_metrics,
    _unit,
    evaluate_answer_cache,
    evaluate_pairs,
    load_pairs,
    load_positives,
    load_questions,
    split_questions,
)

from chatcache.evals import gptcache_peer

from .common import BenchRun, bench_arguments

QUICK_EVERY = 5  # quick runs keep every fifth BANKING77 question, so each category stays in
QUICK_PAWS = 1500


def every_nth_question(source: Path, target: Path, n: int) -> Path:
    """Every `n`-th row of a `text,category` CSV (a question may span lines, so csv reads it)."""
    with open(source, encoding="utf-8", newline="") as rows:
        kept = list(csv.reader(rows))
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8", newline="") as out:
        csv.writer(out).writerows([kept[0], *kept[1::n]])
    return target


def first_pairs(source: Path, target: Path, count: int) -> Path:
    """The header and first `count` pairs of a PAWS TSV (one pair per line)."""
    header, *lines = source.read_text(encoding="utf-8").splitlines()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join([header, *lines[:count]]) + "\n", encoding="utf-8")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    args = parser.parse_args()
    run = BenchRun("answer_cache_evals", args, minutes=(12, 3))
    scratch = args.out / "banking77_split"
    questions, paws = args.data / "banking77" / "train.csv", args.data / "paws_wiki" / "dev.tsv"
    if args.quick:
        questions = every_nth_question(questions, scratch / "quick_questions.csv", QUICK_EVERY)
        paws = first_pairs(paws, scratch / "quick_paws.tsv", QUICK_PAWS)
    train, test = split_questions(questions, scratch)
    run.section("answer_cache", evaluate_answer_cache(train, test))
    positives = args.data / "gptcache_mock" / "mock_pairs_dev.json"
    run.section("pairs", evaluate_pairs(paws, positives))
    run.section("gptcache", gptcache_section(train, test, paws, positives))
    run.finish()


def gptcache_section(train: Path, test: Path, paws: Path, positives: Path) -> dict[str, object]:
    """GPTCache's similar cache on the same split and pairs, with the same MiniLM vectors."""
    stored, asked = load_questions(train), load_questions(test)
    pairs = load_pairs(paws)
    groups = {
        "false_hit_rate": [(a, b) for a, b, label in pairs if label == 0],
        "paws_hit_rate": [(a, b) for a, b, label in pairs if label == 1],
        "positive_hit_rate": load_positives(positives),
    }
    texts = sorted({t for t, _ in stored + asked} | {t for group in groups.values() for pair in group for t in pair})
    vectors = dict(zip(texts, _unit(_bundled_embed(texts))))
    served = gptcache_peer.served_answers(stored, [t for t, _ in asked], vectors)
    result: dict[str, object] = {"banking77": _served_metrics(served, [c for _, c in asked])}
    for name, group in groups.items():
        result[name] = round(sum(gptcache_peer.pair_hits(group, vectors)) / len(group), 4)
    return result


if __name__ == "__main__":
    main()

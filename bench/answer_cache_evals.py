"""Hit rate and precision of the answer cache on labelled data, as `chatcache eval` reports them.

Splits the BANKING77 training file 80/20 per category (fixed seed) into a scratch folder,
then runs `eval answer-cache` on it and `eval pairs` on PAWS and the GPTCache pairs, all with
the default configuration and the bundled MiniLM embedder.

    python -m bench.answer_cache_evals [--data ../shared/data] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chatcache.answer_cache_eval import evaluate_answer_cache, evaluate_pairs, split_questions

from .common import DEFAULT_DATA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    train, test = split_questions(args.data / "banking77" / "train.csv", args.out / "banking77_split")
    report = {
        "benchmark": "answer_cache_evals",
        "answer_cache": evaluate_answer_cache(train, test),
        "pairs": evaluate_pairs(args.data / "paws_wiki" / "dev.tsv", args.data / "gptcache_mock" / "mock_pairs_dev.json"),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

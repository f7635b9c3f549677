"""The answer cache under a user-set error rate on labelled data, as `chatcache eval` reports it.

For D in 0.005, 0.01 and 0.02 (at 95%), one evaluation per data set runs the cache under the
bound (`bound@D`: stores the training questions, calibrates, replays the held-out ones) beside
today's fixed configuration, the cache without verification, embedding-only thresholds (fixed,
and the one certified for D) and GPTCache's default similar cache, all on the same MiniLM vectors:

- BANKING77: the training file split 80/20 per category (seed 0) into a scratch folder; the
  official test split is held back.
- CLINC150: `train` and `oos_train` stored, `val` and `oos_val` replayed (its test parts are held
  back); an out-of-scope question served anything is an error.
- Pairs: PAWS dev and GPTCache's dev pairs, `calibrated@D` choosing its point on the first half
  of each file and every run measured on the second (`chatcache eval pairs`).

    python -m bench.answer_cache_evals [--data ../shared/data] [--out bench/out] [--quick]

About 60 minutes on 2 CPU cores, scaled from the quick run, not yet timed whole (embedding
about 35,000 texts; per data set a calibration of every stored question for each D and the fixed
configuration; a cache per pair for each of eight runs; GPTCache warmed with 8,000 and 15,100
questions, and one per pair). --quick (every fifth question of each data set, the first 1,500
PAWS pairs) took 13 minutes on 2026-12-06, beside two other benchmarks.
Results are written to bench/out/answer_cache_evals.json as each data set finishes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chatcache.evals.answer_cache import CLINC_TEST, CLINC_TRAIN, evaluate_answer_cache, load_clinc, load_questions, split_questions
from chatcache.evals.answer_cache_pairs import evaluate_pairs

from .common import BenchRun, bench_arguments

MAX_ERROR_RATES = (0.005, 0.01, 0.02)
QUICK_EVERY = 5  # quick runs keep every fifth question; files list a category's rows together, so each stays
QUICK_PAWS = 1500


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
    run = BenchRun("answer_cache_evals", args, minutes=(60, 13))
    every = QUICK_EVERY if args.quick else 1
    scratch = args.out / "banking77_split"
    train, test = split_questions(args.data / "banking77" / "train.csv", scratch)
    banking = evaluate_answer_cache(load_questions(train)[::every], load_questions(test)[::every], max_error_rates=MAX_ERROR_RATES)
    run.section("banking77", banking)
    clinc = args.data / "clinc150" / "data_full_train_val.json"
    run.section(
        "clinc150",
        evaluate_answer_cache(
            load_clinc(clinc, CLINC_TRAIN)[::every], load_clinc(clinc, CLINC_TEST)[::every], max_error_rates=MAX_ERROR_RATES
        ),
    )
    paws = args.data / "paws_wiki" / "dev.tsv"
    if args.quick:
        paws = first_pairs(paws, scratch / "quick_paws.tsv", QUICK_PAWS)
    positives = args.data / "gptcache_mock" / "mock_pairs_dev.json"
    run.section("pairs", evaluate_pairs(paws, positives, max_error_rates=MAX_ERROR_RATES))
    plot({"BANKING77": banking, "CLINC150": run.report["clinc150"]}, args.out / "answer_cache_evals.png")
    run.finish()


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Hit rate against the measured error (with its interval) of every run, a panel per data set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5))
    for axis, (name, result) in zip(axes, results.items()):
        for run, row in result["runs"].items():
            if run.startswith("without"):
                continue
            error, (low, high) = row["error_rate"] * 100, row["error_interval"]
            axis.errorbar(
                error, row["hit_rate"] * 100, xerr=[[error - low * 100], [high * 100 - error]], fmt="o", capsize=3, label=run
            )
        for rate in MAX_ERROR_RATES:
            axis.axvline(rate * 100, color="grey", linewidth=0.6, linestyle=":")
        axis.set_xscale("symlog", linthresh=1)
        axis.set_xlim(left=0)
        axis.set_xlabel("error among served answers, % (95% interval)")
        axis.set_ylabel("questions served, %")
        axis.set_title(f"{name}: bounds at 0.5, 1, 2% (dotted)")
    axes[-1].legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

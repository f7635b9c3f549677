"""Three ways of holding the answer cache's error bound, compared on BANKING77's training file only.

    python -m bench.answer_cache_bound [--data ../shared/data] [--out bench/out] [--quick] [--audit-rate 0.1]

The training file is split 80/20 per category (seed 0) as `bench.answer_cache_evals` does, and
only its 80% is used here, split again 80/20 (seed 1) into the questions a cache holds and the
questions asked of it. For each bound D in 0.005, 0.01 and 0.02 at 95%:

- leave_one_out (the product's way, `chatcache/answer_cache/calibration.py`): the cache holds
  all its questions and asks each of the others, its heads cross-fitted;
- split: Learn-then-Test on a held-out calibration split (what MAPIE's risk controllers do): a
  fifth of the cache's questions is set aside and asked of the other four fifths;
- online: the cache starts empty and the questions arrive one at a time (a miss is answered by
  the model and stored, a hit is served); a share `--audit-rate` of arrivals is audited (the
  model answers anyway, so the trial is labelled, as vCache learns its thresholds from the LLM's
  answers) and the point is re-chosen from the audits every 250 arrivals.

All three choose a point of `decision.PATH` by the same fixed-sequence test and judge a
question with the lookup's own code (`decision.read`, `calibration.trial`). Reported per way:
hit rate and error (with a 95% interval) on the questions asked, the point, the calibration
trials it rested on; for online also what its arrivals were served while it learnt.

About 12 minutes on 2 CPU cores (embedding 8,000 questions, 15 fits of answer heads for the
calibrations, about 70 for each bound as the online cache grows); --quick keeps every third
question, about 7.
Results go to bench/out/answer_cache_bound.json as each way finishes, and a plot beside it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatcache.answer_cache.bound import interval
from chatcache.answer_cache.calibration import Trial, calibrate, leave_one_out, nearest, trial
from chatcache.answer_cache.decision import PATH, reach, read
from chatcache.answer_cache.heads import AnswerHead, fit_head
from chatcache.evals.answer_cache import _bundled_embed, _unit, load_questions, split_questions

from .common import BenchRun, bench_arguments

BOUNDS = (0.005, 0.01, 0.02)
CONFIDENCE = 0.95
NEIGHBORS = 10  # the cache's defaults
MIN_WORDINGS = 5
RECHOOSE_EVERY = 250
QUICK_EVERY = 3


@dataclass(frozen=True)
class Rows:
    vectors: np.ndarray
    answers: list[str]
    questions: list[str]

    def take(self, rows: Sequence[int]) -> Rows:
        return Rows(self.vectors[list(rows)], [self.answers[i] for i in rows], [self.questions[i] for i in rows])


def ask(stored: Rows, head: AnswerHead | None, asked: Rows) -> list[Trial]:
    """Each asked question judged against the stored ones, as a lookup would judge it."""
    trials = []
    for start in range(0, len(asked.answers), 1024):
        similarities = asked.vectors[start : start + 1024] @ stored.vectors.T
        for offset, scores in enumerate(similarities):
            row = start + offset
            found = nearest(scores, reach(NEIGHBORS, head))
            reading = read(found, stored.answers.__getitem__, head, asked.vectors[row], NEIGHBORS)
            trials.append(trial(reading, asked.questions[row], stored.questions.__getitem__, asked.answers[row], True))
    return trials


def choose(trials: Sequence[Trial], bound: float) -> int | None:
    """The step of `PATH` the trials certify, as the product's calibration chooses it."""
    point = calibrate(trials, bound, CONFIDENCE).point
    return None if point is None else PATH.index(point)


def outcome(trials: Sequence[Trial], step: int | None) -> dict[str, Any]:
    """What the asked questions get at `step` (None: exact repeats only, none here)."""
    served = [t for t in trials if step is not None and t.rank is not None and t.rank <= step]
    wrong = sum(t.wrong for t in served)
    low, high = interval(wrong, len(served), CONFIDENCE)
    return {
        "hit_rate": round(len(served) / len(trials), 4),
        "error_rate": round(wrong / len(served), 4) if served else 0.0,
        "interval": [round(low, 4), round(high, 4)],
        "served": len(served),
        "wrong": wrong,
        "point": None if step is None else vars(PATH[step]),
    }


def online(stored: Rows, dev: Rows, bound: float, audit_rate: float, seed: int = 0) -> dict[str, Any]:
    """The cache learns its point from audited arrivals while it fills; then the dev questions are asked."""
    rng = np.random.default_rng(seed)
    arrivals = stored.take(rng.permutation(len(stored.answers)).tolist())
    kept = Rows(np.empty_like(arrivals.vectors), [], [])  # the first len(kept.answers) rows are used
    head: AnswerHead | None = None
    fitted_on = 0
    step: int | None = None
    audits: list[Trial] = []
    served = wrong = 0
    for row in range(len(arrivals.answers)):
        hit = False
        if kept.answers:
            holding = Rows(kept.vectors[: len(kept.answers)], kept.answers, kept.questions)
            judged = ask(holding, head, arrivals.take([row]))[0]
            hit = step is not None and judged.rank is not None and judged.rank <= step
            served += hit
            wrong += hit and judged.wrong
            if rng.random() < audit_rate:
                audits.append(judged)
                hit = False  # the model answered: its answer is stored as any miss's
        if not hit:
            kept.vectors[len(kept.answers)] = arrivals.vectors[row]
            kept.answers.append(arrivals.answers[row])
            kept.questions.append(arrivals.questions[row])
            count = len(kept.answers)
            if count >= 2 * MIN_WORDINGS and count - fitted_on >= 0.1 * fitted_on:
                head, fitted_on = fit_head(kept.vectors[:count], kept.answers, MIN_WORDINGS), count
        if (row + 1) % RECHOOSE_EVERY == 0:
            step = choose(audits, bound)
    final = Rows(kept.vectors[: len(kept.answers)], kept.answers, kept.questions)
    low, high = interval(wrong, served, CONFIDENCE)
    return {
        **outcome(ask(final, fit_head(final.vectors, final.answers, MIN_WORDINGS), dev), step),
        "calibration_trials": len(audits),
        "while_learning": {
            "hit_rate": round(served / len(arrivals.answers), 4),
            "error_rate": round(wrong / served, 4) if served else 0.0,
            "interval": [round(low, 4), round(high, 4)],
        },
    }


def compare(cache_rows: Rows, dev: Rows, audit_rate: float, run: BenchRun) -> dict[str, Any]:
    result: dict[str, Any] = {}
    head = fit_head(cache_rows.vectors, cache_rows.answers, MIN_WORDINGS)
    on_dev = ask(cache_rows, head, dev)
    loo = leave_one_out(cache_rows.vectors, cache_rows.answers, cache_rows.questions, NEIGHBORS, MIN_WORDINGS, True)
    order = np.random.default_rng(1).permutation(len(cache_rows.answers)).tolist()
    calibration, kept = cache_rows.take(order[: len(order) // 5]), cache_rows.take(order[len(order) // 5 :])
    kept_head = fit_head(kept.vectors, kept.answers, MIN_WORDINGS)
    split_trials, split_dev = ask(kept, kept_head, calibration), ask(kept, kept_head, dev)
    for bound in BOUNDS:
        result[f"{bound}"] = {
            "leave_one_out": {**outcome(on_dev, choose(loo, bound)), "calibration_trials": len(loo)},
            "split": {**outcome(split_dev, choose(split_trials, bound)), "calibration_trials": len(split_trials)},
            "online": online(cache_rows, dev, bound, audit_rate),
        }
        run.section("banking77", result)
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for way, marker in (("leave_one_out", "o"), ("split", "s"), ("online", "^")):
        points = [(row[way]["error_rate"], row[way]["hit_rate"]) for row in result.values()]
        axis.plot([e * 100 for e, _ in points], [h * 100 for _, h in points], marker=marker, label=way)
    for bound in BOUNDS:
        axis.axvline(bound * 100, color="grey", linewidth=0.6, linestyle=":")
    axis.set_xlabel("error among served answers on held-out questions (%)")
    axis.set_ylabel("hit rate (%)")
    axis.set_title("Holding D = 0.5%, 1%, 2% (dotted): BANKING77 training file only")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--audit-rate", type=float, default=0.1, help="share of arrivals the online way audits")
    args = parser.parse_args()
    run = BenchRun("answer_cache_bound", args, minutes=(12, 7))
    scratch = args.out / "answer_cache_bound"
    train, _ = split_questions(args.data / "banking77" / "train.csv", scratch / "outer")  # the held-out fifth is bench.answer_cache_evals'
    cache_file, dev_file = split_questions(train, scratch / "inner", seed=1)
    every = QUICK_EVERY if args.quick else 1
    rows = []
    for path in (cache_file, dev_file):
        labelled = load_questions(path)[::every]
        texts = [text for text, _ in labelled]
        rows.append(Rows(_unit(_bundled_embed(texts)), [c for _, c in labelled], texts))
    result = compare(rows[0], rows[1], args.audit_rate, run)
    plot(result, args.out / "answer_cache_bound.png")
    run.finish()


if __name__ == "__main__":
    main()

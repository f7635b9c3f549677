"""Measure intent recognition on labelled queries: `chatcache eval intents`.

The reader is the nearest-example classifier, or with `--trained` the model `chatcache train`
stores for the same examples and settings (trained first when none is stored; with a CLINC150
file it learns "none of these" from `oos_train` too). The bot whose examples it learns is one of two:
- built from `--train` (a BANKING77-style CSV or CLINC150's JSON): one intent per label, with
  its first `--per-intent` texts as examples, tested on a stratified held-out share of the CSV
  (`--holdout`, `--seed`), on CLINC's `val` and `oos_val`, or on `--test`;
- a bot's own (`--bot`): its intents, examples and `classifier` settings, tested on the rows of
  the labelled file (`--test`, or `--train`, typically the bot's examples file) that are not
  among its examples.
`--oos` adds CLINC150's out-of-scope queries, and its queries of the domains the bot does not
cover, to measure the fallback.

Reported over the test rows: `accuracy` (in-scope rows given their own intent; out_of_scope
counts as wrong), `oos_recall` (out-of-scope rows answered out_of_scope), `oos_precision`
(out_of_scope answers whose row is out of scope), `in_scope_rejected` (in-scope rows answered
out_of_scope), `oos_precision_at_share` (the precision those two give where `--oos-share` of
the queries are out of scope: precision depends on that mix, and CLINC150's validation part
has 100 out-of-scope queries in 3,100 where its test part has 1,000 in 5,500), `confident_share` (in-scope rows given an
intent with confidence above `--promote`, which the engine takes as confirmed without asking)
with `confident_accuracy` among them, and `oos_confident` (out-of-scope rows given an intent
that surely): a confident wrong answer is the mistake a user meets unasked. `reliability`
tables the share right against the confidence (`--plot` draws it).

This module does not tune anything: it measures one setting per run (`--threshold`,
`--reject-score`... override the bot's), on every other row with `--part`, so that settings
chosen on one half can be reported on the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from chatcache.dialog import OUT_OF_SCOPE, BotDefinition, BotDefinitionError, Embed, Intent, IntentClassifier, IntentResult, load_bot
from chatcache.dialog.classifier import PROMOTE_THRESHOLD
from chatcache.dialog.definition import ClassifierSettings, TrainingSettings

from ..errors import ModelNotFoundError
from ..intents.trained import TrainedIntentClassifier, calibration_examples, find_trained, training_examples
from ..intents.training import train_intent_model
from .intent_data import (
    IntentDataError,
    Row,
    evaluation_rows,
    held_out_split,
    is_clinc,
    out_of_scope_rows,
    out_of_scope_training_texts,
    training_texts,
)


_BATCH = 256
_SETTINGS = ("threshold", "margin", "temperature", "reject_score")


@dataclass(frozen=True)
class IntentMetrics:
    """How a classifier did on a set of rows; a share is None when nothing was there to count."""

    n: int
    in_scope: int
    out_of_scope: int
    accuracy: float | None
    oos_recall: float | None
    oos_precision: float | None
    in_scope_rejected: float | None
    confident_share: float | None
    confident_accuracy: float | None
    oos_confident: float | None


def measure(rows: Sequence[Row], results: Sequence[IntentResult], promote_threshold: float = PROMOTE_THRESHOLD) -> IntentMetrics:
    """Score the classifier's verdicts (`results`, one per row) against the rows' labels."""
    pairs = list(zip((label for _, label in rows), results, strict=True))
    in_scope = [(label, r) for label, r in pairs if label != OUT_OF_SCOPE]
    oos = [r for label, r in pairs if label == OUT_OF_SCOPE]
    rejected = [label for label, r in pairs if r.intent == OUT_OF_SCOPE]
    confident = [(label, r) for label, r in in_scope if _sure(r, promote_threshold)]
    return IntentMetrics(
        n=len(pairs),
        in_scope=len(in_scope),
        out_of_scope=len(oos),
        accuracy=_share(sum(r.intent == label for label, r in in_scope), len(in_scope)),
        oos_recall=_share(sum(r.intent == OUT_OF_SCOPE for r in oos), len(oos)),
        oos_precision=_share(rejected.count(OUT_OF_SCOPE), len(rejected)),
        in_scope_rejected=_share(sum(r.intent == OUT_OF_SCOPE for _, r in in_scope), len(in_scope)),
        confident_share=_share(len(confident), len(in_scope)),
        confident_accuracy=_share(sum(r.intent == label for label, r in confident), len(confident)),
        oos_confident=_share(sum(_sure(r, promote_threshold) for r in oos), len(oos)),
    )


def precision_at_share(recall: float, in_scope_rejected: float, oos_share: float) -> float | None:
    """The out-of-scope precision where `oos_share` of the queries are out of scope, from the
    recall and the share of in-scope queries rejected (neither depends on the mix)."""
    caught, wrongly = recall * oos_share, in_scope_rejected * (1.0 - oos_share)
    return caught / (caught + wrongly) if caught + wrongly else None


def classify_rows(classifier: IntentClassifier, rows: Sequence[Row], embed: Embed) -> list[IntentResult]:
    """The classifier's verdict on every row, its texts embedded in one batched pass."""
    embeddings = embed([text for text, _ in rows])
    return [classifier.classify(text, embedding) for (text, _), embedding in zip(rows, embeddings, strict=True)]


def in_batches(embed: Embed, what: str, batch: int = _BATCH) -> Embed:
    """`embed` run over batches of texts of similar length, with progress on stderr.

    A batch is padded to its longest text, so a short query batched with long ones costs as
    much as they do; sorting by length first makes the same vectors cheaper.
    """

    def run(texts: list[str]) -> NDArray[np.floating]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        started = time.perf_counter()
        chunks = []
        for begin in range(0, len(texts), batch):
            chunks.append(np.asarray(embed([texts[i] for i in order[begin : begin + batch]])))
            done = min(begin + batch, len(texts))
            print(f"embedding {what}: {done}/{len(texts)} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        if not chunks:
            return np.zeros((0, 0))
        stacked = np.concatenate(chunks)
        rows = np.empty_like(stacked)
        rows[order] = stacked
        return rows

    return run


def labelled_bot(by_label: dict[str, list[str]], per_intent: int | None = None) -> BotDefinition:
    """A bot with one intent per label, learning from the label's first `per_intent` texts (all when None)."""
    intents = [Intent(name=label, examples=texts[:per_intent]) for label, texts in by_label.items()]
    return BotDefinition(system_prompt="Intent evaluation.", intents=intents)


def bot_test_rows(bot: BotDefinition, rows: list[Row], source: Path) -> list[Row]:
    """The rows of `source` a bot did not learn from nor calibrate on; their labels must be its intents.

    Raises:
        IntentDataError: a label of the file is no intent of the bot.
    """
    unknown = sorted({label for _, label in rows} - {intent.name for intent in bot.intents} - {OUT_OF_SCOPE})
    if unknown:
        raise IntentDataError(f"{source}: labels that are no intent of the bot: {', '.join(unknown)}")
    seen = {example for intent in bot.intents for example in (*intent.examples, *intent.calibration_examples)}
    return [(text, label) for text, label in rows if text not in seen]


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval intents`: 0 with the metrics printed, 2 for input that cannot be used."""
    args = parse_arguments(argv)
    try:
        report = evaluate(args)
    except (IntentDataError, BotDefinitionError, FileNotFoundError, ModelNotFoundError) as error:
        print(f"chatcache eval intents: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else _table(report))
    return 0


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options of `chatcache eval intents` (what `bench.trained_intents` passes too)."""
    return _parser().parse_args(argv)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the reader the options name on the rows they name; the report `main` prints.

    Raises:
        IntentDataError, BotDefinitionError, FileNotFoundError, ModelNotFoundError: input that cannot be used.
    """
    started = time.perf_counter()
    bot, rows = _bot_and_rows(args)
    bot = bot.model_copy(update={"classifier": _settings(bot.classifier, args)})
    rows = rows if args.part == "all" else rows[args.part == "odd" :: 2]
    if args.trained:
        model = _trained_model(bot)
        results = model.classify_many([text for text, _ in rows])
        reader: dict[str, object] = {"trained": model.info.key, "settings": bot.training.model_dump(), "training": model.info.measured}
    else:
        embed = _embedder(args.embedder)
        classifier = IntentClassifier(bot, in_batches(embed, "examples"))
        results = classify_rows(classifier, rows, in_batches(embed, "test rows"))
        reader = {"nearest_examples": bot.classifier.model_dump()}
    metrics = measure(rows, results, args.promote)
    at_share = None
    if args.oos_share is not None and metrics.oos_recall is not None and metrics.in_scope_rejected is not None:
        at_share = precision_at_share(metrics.oos_recall, metrics.in_scope_rejected, args.oos_share)
    report: dict[str, Any] = {
        **asdict(metrics),
        "oos_share": args.oos_share,
        "oos_precision_at_share": at_share,
        "promote_threshold": args.promote,
        "intents": len(bot.intents),
        "examples": sum(len(intent.examples) for intent in bot.intents),
        "out_of_scope_examples": len(bot.out_of_scope_examples),
        "classifier": reader,
        "reliability": reliability(rows, results),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.plot is not None:
        plot_reliability(report["reliability"], args.plot, f"{report['n']} rows, accuracy {metrics.accuracy}")
    return report


def reliability(rows: Sequence[Row], results: Sequence[IntentResult], bins: int = 10) -> list[dict[str, float | int]]:
    """How often the verdict on an in-scope row is right, by its confidence: one dict per
    non-empty bin of `bins` equal widths (its mean confidence, accuracy and row count). A
    calibrated reader's accuracy follows its confidence; out_of_scope verdicts count as wrong."""
    pairs = [(r.confidence, r.intent == label) for (_, label), r in zip(rows, results, strict=True) if label != OUT_OF_SCOPE]
    table = []
    for index in range(bins):
        low, high = index / bins, (index + 1) / bins
        inside = [(c, right) for c, right in pairs if low <= c < high or (index == bins - 1 and c == 1.0)]
        if inside:
            table.append(
                {
                    "confidence": round(float(np.mean([c for c, _ in inside])), 4),
                    "accuracy": round(float(np.mean([right for _, right in inside])), 4),
                    "rows": len(inside),
                }
            )
    return table


def plot_reliability(table: list[dict[str, float | int]], path: Path, title: str) -> None:
    """The reliability diagram of `reliability`'s table as a PNG: accuracy against confidence, with the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 5))
    axis.plot([0, 1], [0, 1], linestyle=":", color="grey", label="calibrated")
    axis.plot([row["confidence"] for row in table], [row["accuracy"] for row in table], marker="o", label="measured")
    for row in table:
        axis.annotate(str(row["rows"]), (float(row["confidence"]), float(row["accuracy"])), fontsize=7, xytext=(3, -9), textcoords="offset points")
    axis.set(xlabel="confidence of the verdict", ylabel="share of verdicts right", title=title, xlim=(0, 1), ylim=(0, 1.02))
    axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _trained_model(bot: BotDefinition) -> TrainedIntentClassifier:
    """The model `chatcache train` stores for this bot's examples and settings: found, or trained now."""
    stored = find_trained(bot)
    if stored is None:
        stored = train_intent_model(training_examples(bot), bot.training, calibration=calibration_examples(bot))
    return TrainedIntentClassifier(stored, reading=bot.training)


def _bot_and_rows(args: argparse.Namespace) -> tuple[BotDefinition, list[Row]]:
    """The classifier's bot and the rows to test it on, as the options ask."""
    if args.bot is not None:
        if args.train is not None and args.test is not None:
            raise IntentDataError("with --bot the bot's examples are its training data: give one labelled file, --test or --train")
        if (args.per_intent, args.holdout) != (None, None):
            raise IntentDataError("--per-intent and --holdout apply to --train without --bot; a bot's examples_file sets its per_intent")
        source = args.test or args.train
        if source is None:
            raise IntentDataError("--bot needs a labelled file to test on: --test PATH")
        bot = load_bot(args.bot)
        rows = bot_test_rows(bot, evaluation_rows(source), source)
    else:
        if args.train is None:
            raise IntentDataError("give --train PATH (a `text,category` CSV or CLINC150's JSON), or --bot BOT")
        by_label = training_texts(args.train)
        if args.holdout is not None and (args.test is not None or is_clinc(args.train)):
            raise IntentDataError("--holdout splits a --train CSV; with --test or CLINC150's JSON the test rows are given")
        if args.test is not None:
            rows = evaluation_rows(args.test)
            unknown = sorted({label for _, label in rows} - set(by_label) - {OUT_OF_SCOPE})
            if unknown:
                raise IntentDataError(f"{args.test}: labels that {args.train} has no rows of: {', '.join(unknown)}")
        elif is_clinc(args.train):  # it has its own test part
            rows = evaluation_rows(args.train)
        else:
            by_label, rows = held_out_split(by_label, 0.2 if args.holdout is None else args.holdout, args.seed)
        bot = labelled_bot(by_label, args.per_intent)
        if args.trained:  # a trained model learns "none of these" too, from the file's out-of-scope training queries
            bot = bot.model_copy(update={"out_of_scope_examples": out_of_scope_training_texts(args.train)})
    for option, value in (("epochs", args.epochs), ("reject_share", args.reject_share)):
        if value is not None:
            if not args.trained:
                raise IntentDataError(f"--{option.replace('_', '-')} sets how a trained model is trained or reads: it needs --trained")
            try:
                training = TrainingSettings.model_validate({**bot.training.model_dump(), option: value})
            except ValidationError as error:
                raise IntentDataError(f"--{option.replace('_', '-')}: {error.errors()[0]['msg']}") from None
            bot = bot.model_copy(update={"training": training})
    if args.oos is not None:
        rows += out_of_scope_rows(args.oos, set(args.in_scope_domains.split(",")))
    if not rows:
        raise IntentDataError(f"{args.test or args.train}: no rows left to test on")
    return bot, rows


def _settings(base: ClassifierSettings, args: argparse.Namespace) -> ClassifierSettings:
    """The bot's classifier settings with the options' overrides, checked as a bot file's would be."""
    overrides = {name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None}
    try:
        return ClassifierSettings.model_validate({**base.model_dump(), **overrides})
    except ValidationError as exc:
        problems = [f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}" for error in exc.errors()]
        raise IntentDataError("; ".join(problems)) from None


def _embedder(name: str) -> Embed:
    from ..model.loading import load_embedder
    from ..steering.hcac import sentence_embed

    return sentence_embed(load_embedder(name))


def _table(report: dict[str, object]) -> str:
    def show(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, float) else "-"

    return "\n".join(
        [
            f"rows         {report['n']} ({report['in_scope']} in scope, {report['out_of_scope']} out of scope); "
            f"{report['intents']} intents, {report['examples']} examples",
            f"accuracy     {show(report['accuracy'])}",
            f"out of scope recall {show(report['oos_recall'])}, precision {show(report['oos_precision'])}"
            + (f" ({show(report['oos_precision_at_share'])} where {report['oos_share']} of queries are)" if report["oos_share"] else "")
            + f"; {show(report['in_scope_rejected'])} of in-scope rows rejected",
            f"confident    {show(report['confident_share'])} of in-scope rows above {report['promote_threshold']}, "
            f"accuracy {show(report['confident_accuracy'])}; {show(report['oos_confident'])} of out-of-scope rows",
            f"classifier   {report['classifier']}",
            f"seconds      {report['seconds']}",
        ]
    )


def _share(count: int, total: int) -> float | None:
    return count / total if total else None


def _sure(result: IntentResult, promote_threshold: float) -> bool:
    return result.intent != OUT_OF_SCOPE and result.confidence > promote_threshold


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatcache eval intents", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=Path, help="labelled queries: a `text,category` CSV (BANKING77) or CLINC150's JSON")
    parser.add_argument("--test", type=Path, help="labelled queries to test on (default: held out from --train)")
    parser.add_argument("--bot", help="test this bot's own classifier (a YAML file or a shipped bot name)")
    parser.add_argument("--oos", type=Path, help="CLINC150's JSON: its out-of-scope queries and other domains' join the test rows")
    parser.add_argument("--oos-share", type=_fraction, help="also report the out-of-scope precision where this share of queries is out of scope")
    parser.add_argument("--in-scope-domains", default="banking,credit_cards", help="CLINC domains the bot covers, left out of --oos")
    parser.add_argument("--per-intent", type=_positive, help="examples per intent from --train (default: all)")
    parser.add_argument("--holdout", type=_fraction, help="share of each label of a --train CSV held out to test on (default 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="which rows --holdout holds out")
    parser.add_argument("--part", choices=("all", "even", "odd"), default="all", help="every other test row (tune on one half)")
    parser.add_argument("--promote", type=_fraction, default=PROMOTE_THRESHOLD, help="confidence above which an intent is confirmed")
    for name in _SETTINGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"override the classifier's {name.replace('_', ' ')}")
    parser.add_argument("--trained", action="store_true", help="read with the model `chatcache train` stores for these examples (trained now if none is)")
    parser.add_argument("--epochs", type=_positive, help="with --trained: override the training settings' epochs")
    parser.add_argument("--reject-share", type=_fraction, help="with --trained: override the share of in-scope messages the familiarity rule may reject (no training again)")
    parser.add_argument("--plot", type=Path, help="write the reliability diagram (accuracy against confidence) to this PNG")
    parser.add_argument("--embedder", default="bundled", help="'bundled' (all-MiniLM-L6-v2), a sentence-transformers id or path")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


if __name__ == "__main__":
    raise SystemExit(main())

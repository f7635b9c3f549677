"""Follow-ups read in context: `chatcache eval followups --data DIALOGUES.jsonl`.

"What's their phone number?" after "find me a table for two in San Jose" is still about the
restaurant, though it names none. `dialog.read_in_context` re-reads a message that is unclear
alone after the previous one; this evaluation measures what that buys on SGD dialogues, whose
user turns carry the active intent of each service. One dialogue a line, as in
`../shared/data/sgd/dev_dialogues.jsonl` (other fields are ignored):
`{"turns": [{"speaker": "USER", "utterance": "...", "frames": [{"active_intent": "FindRestaurants"}]}, ...]}`.

Labels are SGD intent names (`SearchHotel`), not service-qualified ones: Hotels_1's and
Hotels_4's `SearchHotel` are two versions of one task, which a user's words cannot tell apart.

The dialogues are split in two by position in the file (even ones teach, odd ones test), not
by service: the classifier can only give an intent it has examples of, and most intents belong
to one service, so a split by service would leave almost nothing it could get right. The file
is grouped by services, so both halves see every service.

- Teaching: in the even dialogues, the user turns where an intent starts (the first turn of
  each active intent), the first `PER_INTENT` of each intent.
- Test rows, from the odd dialogues: *follow-ups*, user turns whose intent is the previous user
  turn's, and *starts*, the turns where an intent starts. Starts are kept apart to show that
  context does not pull a new request back into the old topic.

Each row is read three ways: alone; in context, after the previous user turn with its gold
intent (the usual oracle setting); and chained, after the previous user turn with the intent
the classifier gave it in context, as the engine sees a conversation. A user turn with no
active intent (a greeting, "that's all") is never a row, and as a previous turn its gold intent
is out of scope, so the turn after it is not re-read in the oracle setting.

The reader is the nearest-example classifier (default settings), or with `--trained` an
intent model trained on the teaching examples by `chatcache train`'s code (`TRAINING`, stored
in the data directory under the key of its examples and settings, so a second run reads with
the stored model). This module measures; it tunes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ValidationError

from chatcache.dialog import OUT_OF_SCOPE, Embed, IntentClassifier, IntentReader, IntentResult, PreviousTurn, read_in_context
from chatcache.dialog.definition import TrainingSettings

from ..errors import ModelNotFoundError
from ..intents.trained import TrainedIntentClassifier
from .intent_data import IntentDataError
from .intents import _embedder, _positive, _trained_model, in_batches, labelled_bot

PER_INTENT = 40
"""Examples an intent learns from, as the bank bot learns each of its intents from 40 rows."""

TRAINING = TrainingSettings()
"""How `--trained` trains: as `chatcache train` does by default (3 epochs; `--epochs` overrides
them). Modest on purpose: on 2 shared cores a step over SGD's longer turns takes seconds, and the
bank bot's 8 epochs would take 2.7 times as long (bench/README.md, "Follow-ups read in context")."""

READINGS = ("alone", "context", "chained")
_NO_INTENT = "NONE"  # SGD's active intent before a service's first request


@dataclass(frozen=True)
class UserTurn:
    """One user message and its gold intent (OUT_OF_SCOPE when it has no active intent)."""

    text: str
    intent: str


@dataclass(frozen=True)
class Reading:
    """How one way of reading did on the test rows; a share is None when there was nothing to count.

    Attributes:
        follow_up_accuracy: Follow-ups given their intent.
        start_accuracy: Starts given their intent.
        follow_ups_out_of_scope: Follow-ups answered out of scope.
        follow_ups_rescued: Follow-ups out of scope alone and given an intent by this reading.
        starts_pulled_back: Starts given the intent this reading was told the previous turn
            had, where alone they were not: context pulling a new request into the old topic.
    """

    follow_up_accuracy: float | None
    start_accuracy: float | None
    follow_ups_out_of_scope: float | None
    follow_ups_rescued: float | None
    starts_pulled_back: float | None


@dataclass(frozen=True)
class FollowUpReport:
    """The three readings of the test rows, with the rows counted."""

    follow_ups: int
    starts: int
    unknown_intent_rows: int  # rows whose intent the teaching half never starts: left out
    readings: dict[str, Reading]


@dataclass(frozen=True)
class _Row:
    """A test row: its kind and gold intent, and by reading the verdict and the previous intent told."""

    kind: str
    gold: str
    verdict: dict[str, str]
    told: dict[str, str]


class _Frame(BaseModel):
    active_intent: str | None = None  # on user turns only


class _Turn(BaseModel):
    speaker: str
    utterance: str
    frames: list[_Frame]


class _Dialogue(BaseModel):
    turns: list[_Turn]


def read_dialogues(path: Path) -> list[list[UserTurn]]:
    """The user turns of each dialogue of an SGD JSON Lines file, in order, with their intents.

    A turn that starts an intent while thanking for the previous one has a frame of each
    service, both active; its intent is the new one.

    Raises:
        IntentDataError: the file is missing, not UTF-8, or a line is no dialogue record.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise IntentDataError(f"{path}: cannot read it: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise IntentDataError(f"{path}: not UTF-8 text") from exc
    dialogues = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = _Dialogue.model_validate_json(line)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(map(str, error["loc"])) or "the line"
            raise IntentDataError(f"{path}: line {number}: {where}: {error['msg']} (an SGD dialogue record: `chatcache eval followups --help`)") from None
        turns, previous = [], OUT_OF_SCOPE
        for turn in record.turns:
            if turn.speaker == "USER":
                previous = _intent(turn.frames, previous)
                turns.append(UserTurn(turn.utterance, previous))
        dialogues.append(turns)
    return dialogues


def training_examples(dialogues: Iterable[Sequence[UserTurn]], per_intent: int = PER_INTENT) -> dict[str, list[str]]:
    """The texts of the turns where an intent starts, by intent, the first `per_intent` of each."""
    by_intent: dict[str, list[str]] = {}
    for dialogue in dialogues:
        for before, turn in with_previous(dialogue):
            if _kind(before, turn) == "start":
                texts = by_intent.setdefault(turn.intent, [])
                if len(texts) < per_intent:
                    texts.append(turn.text)
    return by_intent


def evaluate_followups(reader: IntentReader, dialogues: Iterable[Sequence[UserTurn]], intents: set[str]) -> FollowUpReport:
    """Read every user turn of the dialogues alone, in context and chained; score the rows.

    Args:
        reader: Any intent classifier; it is asked about each message and about the previous
            message joined to it.
        dialogues: The test dialogues' user turns.
        intents: The intents the reader knows; a row of another intent is left out (counted).
    """
    rows: list[_Row] = []
    unknown = 0
    for dialogue in dialogues:
        chained = OUT_OF_SCOPE  # the chained reading of the previous turn
        for before, turn in with_previous(dialogue):
            told = {"alone": OUT_OF_SCOPE, "context": OUT_OF_SCOPE if before is None else before.intent, "chained": chained}
            verdict = {
                "alone": reader.classify(turn.text).intent,
                "context": read_in_context(reader, turn.text, _previous(before, told["context"])).intent,
                "chained": read_in_context(reader, turn.text, _previous(before, told["chained"])).intent,
            }
            kind = _kind(before, turn)
            if kind is not None and turn.intent not in intents:
                unknown += 1
            elif kind is not None:
                rows.append(_Row(kind, turn.intent, verdict, told))
            chained = verdict["chained"]
    follow_ups = [row for row in rows if row.kind == "follow_up"]
    starts = [row for row in rows if row.kind == "start"]
    return FollowUpReport(len(follow_ups), len(starts), unknown, {name: _score(name, follow_ups, starts) for name in READINGS})


def with_previous(dialogue: Sequence[UserTurn]) -> Iterator[tuple[UserTurn | None, UserTurn]]:
    """Each user turn with the one before it (None for the first)."""
    return zip([None, *dialogue], dialogue)


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache eval followups`: 0 with the accuracies printed, 2 for input that cannot be used."""
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        if args.epochs is not None and not args.trained:
            raise IntentDataError("--epochs sets how the trained reader is trained: it needs --trained")
        dialogues = read_dialogues(args.data)
        teaching, testing = dialogues[0::2], dialogues[1::2]
        examples = training_examples(teaching)
        if not examples or not any(_kind(before, turn) == "follow_up" for d in testing for before, turn in with_previous(d)):
            raise IntentDataError(f"{args.data}: no intent starts in the even dialogues or no follow-ups in the odd ones")
        asked = asked_texts(testing)
        if args.trained:
            settings = TRAINING if args.epochs is None else TRAINING.model_copy(update={"epochs": args.epochs})
            reader, described = _trained_reader(examples, settings, asked)
        else:
            reader, described = _nearest_reader(examples, asked)
    except (ValueError, ModelNotFoundError) as error:  # ValueError: IntentDataError, or training's refusal of one intent
        print(f"chatcache eval followups: {error}", file=sys.stderr)
        return 2
    print(f"reading {sum(map(len, testing))} user turns of {len(testing)} dialogues", file=sys.stderr)
    report = evaluate_followups(reader, testing, set(examples))
    summary = {
        **asdict(report),
        "dialogues": {"teaching": len(teaching), "testing": len(testing)},
        "intents": len(examples),
        "examples": sum(map(len, examples.values())),
        "classifier": described,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary) if args.json else _table(report, summary))
    return 0


def asked_texts(dialogues: Iterable[Sequence[UserTurn]]) -> list[str]:
    """Every text a reader is asked about while the dialogues are read: each user turn, and each
    joined to the turn before as `read_in_context` joins them (a guess; it is the same rule)."""
    asked = []
    for before, turn in (pair for dialogue in dialogues for pair in with_previous(dialogue)):
        asked += [turn.text] if before is None else [turn.text, f"{before.text} {turn.text}"]
    return asked


def _nearest_reader(examples: dict[str, list[str]], asked: list[str]) -> tuple[IntentReader, dict[str, object]]:
    """The nearest-example classifier of the teaching examples, every text embedded up front."""
    bot = labelled_bot(examples)
    taught = [text for texts in examples.values() for text in texts]
    return IntentClassifier(bot, _remembering(_embedder("bundled"), [*taught, *asked])), {"nearest_examples": bot.classifier.model_dump()}


def _trained_reader(examples: dict[str, list[str]], settings: TrainingSettings, asked: list[str]) -> tuple[IntentReader, dict[str, object]]:
    """The model `chatcache train` trains on the teaching examples with `settings` (found in the
    data directory when it was trained before), with its verdicts on every text read up front."""
    bot = labelled_bot(examples).model_copy(update={"training": settings})
    model = _trained_model(bot)
    print(f"reading {len(set(asked))} texts with the trained model {model.info.key}", file=sys.stderr)
    return _RememberedVerdicts(model, asked), {"trained": model.info.key, "settings": settings.model_dump(), "training": model.info.measured}


class _RememberedVerdicts:
    """A trained model's verdicts on the texts an evaluation will ask about, read up front in
    batches (one text at a time costs the encoder several times more a text, as with
    `_remembering`); a text not among them is read when asked."""

    def __init__(self, model: TrainedIntentClassifier, texts: list[str]) -> None:
        unique = list(dict.fromkeys(texts))
        self._model = model
        self._known = dict(zip(unique, model.classify_many(unique), strict=True))

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        """The model's verdict on `text` (`embedding` is ignored, as the trained model ignores it)."""
        if text not in self._known:
            self._known[text] = self._model.classify(text)
        return self._known[text]


def _intent(frames: list[_Frame], previous: str) -> str:
    active = [frame.active_intent for frame in frames if frame.active_intent is not None and frame.active_intent != _NO_INTENT]
    return next((intent for intent in active if intent != previous), active[0] if active else OUT_OF_SCOPE)


def _kind(before: UserTurn | None, turn: UserTurn) -> str | None:
    """The row a turn makes: "follow_up", "start", or None (a turn with no intent is no row)."""
    if turn.intent == OUT_OF_SCOPE:
        return None
    return "follow_up" if before is not None and before.intent == turn.intent else "start"


def _previous(before: UserTurn | None, intent: str) -> PreviousTurn | None:
    return None if before is None else PreviousTurn(before.text, intent)


def _score(name: str, follow_ups: list[_Row], starts: list[_Row]) -> Reading:
    def share(hits: Iterable[bool], rows: list[_Row]) -> float | None:
        return sum(hits) / len(rows) if rows else None

    return Reading(
        follow_up_accuracy=share((row.verdict[name] == row.gold for row in follow_ups), follow_ups),
        start_accuracy=share((row.verdict[name] == row.gold for row in starts), starts),
        follow_ups_out_of_scope=share((row.verdict[name] == OUT_OF_SCOPE for row in follow_ups), follow_ups),
        follow_ups_rescued=share((row.verdict["alone"] == OUT_OF_SCOPE != row.verdict[name] for row in follow_ups), follow_ups),
        starts_pulled_back=share((OUT_OF_SCOPE != row.told[name] == row.verdict[name] != row.verdict["alone"] for row in starts), starts),
    )


def _remembering(embed: Embed, texts: list[str]) -> Embed:
    """`embed` with `texts` embedded up front in batches of similar length: the reader asks
    for one text at a time, which costs MiniLM several times more per text. The joined texts
    are guessed as `read_in_context` joins them; a text not guessed is embedded when asked."""
    known = dict(zip(texts, in_batches(embed, "examples and test turns")(texts)))

    def lookup(asked: list[str]) -> NDArray[np.floating]:
        missing = [text for text in asked if text not in known]
        if missing:
            known.update(zip(missing, embed(missing)))
        return np.stack([known[text] for text in asked])

    return lookup


def _table(report: FollowUpReport, summary: dict[str, Any]) -> str:
    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    columns = [field.name for field in fields(Reading)]
    dialogues = summary["dialogues"]
    return "\n".join(
        [
            f"dialogues    {dialogues['teaching']} teaching, {dialogues['testing']} testing; {summary['intents']} intents, {summary['examples']} examples",
            f"test rows    {report.follow_ups} follow-ups, {report.starts} starts ({report.unknown_intent_rows} of intents never taught, left out)",
            f"{'reading':10} " + " ".join(f"{column:>23}" for column in columns),
            *(f"{name:10} " + " ".join(f"{show(getattr(reading, column)):>23}" for column in columns) for name, reading in report.readings.items()),
            f"reader       {'trained model ' + summary['classifier']['trained'] if 'trained' in summary['classifier'] else 'nearest examples'}",
            f"seconds      {summary['seconds']}",
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatcache eval followups", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="SGD dialogues, one JSON object per line (dev_dialogues.jsonl)")
    parser.add_argument("--trained", action="store_true", help="read with an intent model trained on the teaching examples (stored; trained now if none is)")
    parser.add_argument("--epochs", type=_positive, help=f"with --trained: epochs of training (default {TRAINING.epochs})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())

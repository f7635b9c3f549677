"""A follow-up read in the light of the previous message (`dialog.classifier.read_in_context`):
exactly, with a scripted reader, and once through the toy embedder's classifier and the manager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatcache.dialog import OUT_OF_SCOPE, DialogueManager, IntentClassifier, IntentResult, PreviousTurn, load_bot, read_in_context
from chatcache.dialog.classifier import FOLLOW_UP_BELOW

PREVIOUS = PreviousTurn("can I send money abroad?", "transfer_abroad")
FOLLOW_UP = "and how much does it cost?"
JOINED = f"{PREVIOUS.text} {FOLLOW_UP}"


class Scripted:
    """An `IntentReader` that reads each text as it is told to (out of scope otherwise) and
    records what it was asked."""

    def __init__(self, readings: dict[str, tuple[str, float]]) -> None:
        self.readings = readings
        self.asked: list[str] = []

    def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
        self.asked.append(text)
        intent, confidence = self.readings.get(text, (OUT_OF_SCOPE, 0.0))
        return IntentResult(intent, confidence, 0.0, {})


def test_an_out_of_scope_follow_up_is_read_with_the_previous_message() -> None:
    reader = Scripted({FOLLOW_UP: (OUT_OF_SCOPE, 0.3), JOINED: ("transfer_fees", 0.9)})
    result = read_in_context(reader, FOLLOW_UP, PREVIOUS)
    assert (result.intent, result.confidence) == ("transfer_fees", 0.9)
    assert reader.asked == [FOLLOW_UP, JOINED]


def test_an_unsure_reading_is_re_read_and_the_surer_one_kept() -> None:
    surer = Scripted({FOLLOW_UP: ("opening_hours", 0.6), JOINED: ("transfer_fees", 0.9)})
    assert read_in_context(surer, FOLLOW_UP, PREVIOUS).intent == "transfer_fees"
    less_sure = Scripted({FOLLOW_UP: ("opening_hours", 0.6), JOINED: ("transfer_fees", 0.55)})
    assert read_in_context(less_sure, FOLLOW_UP, PREVIOUS).intent == "opening_hours"


def test_the_joined_reading_must_be_in_scope_and_surer() -> None:
    out = Scripted({FOLLOW_UP: (OUT_OF_SCOPE, 0.3), JOINED: (OUT_OF_SCOPE, 0.45)})
    assert read_in_context(out, FOLLOW_UP, PREVIOUS) == IntentResult(OUT_OF_SCOPE, 0.3, 0.0, {})
    not_surer = Scripted({FOLLOW_UP: (OUT_OF_SCOPE, 0.3), JOINED: ("transfer_fees", 0.3)})
    assert read_in_context(not_surer, FOLLOW_UP, PREVIOUS).intent == OUT_OF_SCOPE


@pytest.mark.parametrize("confidence", [FOLLOW_UP_BELOW, 0.99, 1.0])
def test_a_message_clear_alone_is_never_re_read(confidence: float) -> None:
    reader = Scripted({"when are you open": ("opening_hours", confidence), f"{PREVIOUS.text} when are you open": ("transfer_abroad", 1.0)})
    assert read_in_context(reader, "when are you open", PREVIOUS).intent == "opening_hours"
    assert reader.asked == ["when are you open"]


@pytest.mark.parametrize("previous", [None, PreviousTurn("tell me a joke", OUT_OF_SCOPE)])
def test_without_a_previous_topic_nothing_is_re_read(previous: PreviousTurn | None) -> None:
    reader = Scripted({FOLLOW_UP: (OUT_OF_SCOPE, 0.3), f"tell me a joke {FOLLOW_UP}": ("transfer_fees", 0.9)})
    assert read_in_context(reader, FOLLOW_UP, previous).intent == OUT_OF_SCOPE and reader.asked == [FOLLOW_UP]


def test_the_given_embedding_is_for_the_message_alone() -> None:
    seen: list[np.ndarray | None] = []

    class Recording(Scripted):
        def classify(self, text: str, embedding: np.ndarray | None = None) -> IntentResult:
            seen.append(embedding)
            return super().classify(text, embedding)

    vector = np.ones(3)
    read_in_context(Recording({JOINED: ("transfer_fees", 0.9)}), FOLLOW_UP, PREVIOUS, vector)
    assert seen[0] is vector and seen[1] is None  # the joined text is embedded afresh


BOT = """\
system_prompt: A bank's assistant.
classifier:
  threshold: 0.7
intents:
  - name: transfer_abroad
    examples: ['can I send money abroad', 'transfers to other countries']
    answer: You can send money abroad in the app.
  - name: transfer_fees
    examples: ['how much does it cost to send money abroad', 'what is the fee for sending money abroad']
    answer: Sending money abroad costs 5 EUR.
  - name: opening_hours
    examples: ['when are you open', 'what are your opening hours']
    answer: We are open from 9 to 5.
"""


def test_the_manager_reads_a_follow_up_in_context_and_a_clear_message_alone(tmp_path: Path, embed: Any) -> None:
    path = tmp_path / "abroad.yaml"
    path.write_text(BOT)
    bot = load_bot(path)
    manager = DialogueManager(bot, IntentClassifier(bot, embed))
    assert manager.classifier.classify(FOLLOW_UP).intent == OUT_OF_SCOPE  # alone, it names no topic
    first = manager.handle(None, PREVIOUS.text)
    assert first.intent == "transfer_abroad"
    follow_up = manager.handle(first.state, FOLLOW_UP, previous_text=PREVIOUS.text)
    assert follow_up.intent == "transfer_fees" and follow_up.prompt == "Sending money abroad costs 5 EUR."
    alone = manager.handle(first.state, FOLLOW_UP)  # no previous message given: read alone
    assert alone.intent == OUT_OF_SCOPE
    new_topic = manager.handle(first.state, "when are you open", previous_text=PREVIOUS.text)
    assert new_topic.intent == "opening_hours" and new_topic.prompt == "We are open from 9 to 5."

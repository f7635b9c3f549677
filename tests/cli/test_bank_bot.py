"""The shipped bank bot on the real models: its conversation tests pass, and its actions really
move money on the demo core-banking database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcache.evals.stories import run_story
from chatcache.dialog import load_bot, load_stories
from chatcache.dialog.loader import BOTS_DIR
from chatcache.dialog.training import read_labelled


@pytest.fixture
def bank_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATCACHE_BANK_DB", f"sqlite:///{tmp_path}/bank.db")


def test_the_bank_bot_covers_banking77_and_answers_its_questions_from_the_knowledge_base() -> None:
    bot = load_bot("bank")
    categories = json.loads((Path(__file__).resolve().parents[3] / "shared" / "data" / "banking77" / "categories.json").read_text())
    assert len(categories) == 77
    # Every BANKING77 label is an intent with the data's first 40 rows (35 where the label has only 35).
    assert all(35 <= len(bot.intent(label).examples) <= 40 for label in categories)
    # The rest of each label's rows only calibrate: never among what it learns from.
    rows = read_labelled(BOTS_DIR / "bank" / "examples.csv")
    for label in categories:
        learned, calibrating = bot.intent(label).examples, bot.intent(label).calibration_examples
        assert not set(learned) & set(calibrating) and set(learned) | set(calibrating) == set(rows[label])
    assert sum(len(bot.intent(label).calibration_examples) for label in categories) > 6_500
    questions = [intent for intent in bot.intents if intent.answer is not None]
    assert len(questions) >= 60 and all(intent.name not in bot.flows for intent in questions)
    assert all(intent.answer in bot.instructions for intent in questions if intent.answer is not None)


@pytest.mark.bundled
@pytest.mark.usefixtures("bank_db")
def test_every_bank_story_passes(bundled_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    stories = load_stories(BOTS_DIR / "bank" / "stories.yaml").stories
    assert len(stories) >= 20
    with make_engine(bundled_model, bot="bank", drift=True) as engine:
        results = [run_story(engine, story, f"story-{number}", max_new_tokens=32) for number, story in enumerate(stories)]
    assert [(result.name, result.failures) for result in results if not result.passed] == []


@pytest.mark.bundled
@pytest.mark.usefixtures("bank_db")
def test_a_transfer_moves_money_and_the_next_balance_is_read_afresh(bundled_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    with make_engine(bundled_model, bot="bank") as engine:
        before = engine.chat("s1", "What's my balance?")
        assert before.action is not None and before.action.result is not None
        assert before.action.result["balance"] == "2,500.00"
        assert engine.chat("s1", "Send 250 euros to account 12345674").text == "Shall I send 250 EUR to account 12345674?"
        sent = engine.chat("s1", "yes")
        assert sent.action is not None and sent.action.name == "transfer_money" and sent.action.result is not None
        assert sent.action.result["balance"] == "2,250.00"
        after = engine.chat("s1", "How much money do I have?")
        assert after.action is not None and not after.action.cached  # the transfer dropped the kept balance
        assert after.text.startswith("Your balance is 2,250.00 EUR")
        again = engine.chat("s1", "What's my balance?")
        assert again.action is not None and again.action.cached and again.text == after.text

"""Examples from a labelled file, the knowledge base's answers, and a flow's corrections,
cancellations and digressions, on the toy embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache.dialog import OUT_OF_SCOPE, BotDefinitionError, DialogueManager, IntentClassifier, load_bot
from chatcache.dialog.manager import CANCELLED_REPLY

BOT = """\
system_prompt: You are a bank's assistant.
examples_file:
  path: {path}
  per_intent: 2
knowledge: knowledge.yaml
intents:
  - name: card_arrival
  - name: exchange_rate
    examples: ['what rate do you use to exchange money']
  - name: make_transfer
    slots: [amount, to_account]
    examples: ['I want to send money to someone', 'send 200 to account 12345674']
slots:
  - name: to_account
    pattern: '(?<![\\d.,])(\\d{{8}})(?![\\d.,])'
  - name: amount
    kind: amount
flows:
  make_transfer:
    ask:
      amount: How much would you like to send?
      to_account: Which account?
    confirm: Send {{amount}} to {{to_account}}?
    action: transfer_money
"""
ROWS = """\
text,category
"My card has not arrived yet, where is it?",card_arrival
When will my new card arrive,card_arrival
still waiting for my card to come,card_arrival
what exchange rate do you use,exchange_rate
"""
KNOWLEDGE = """\
answers:
  - intent: card_arrival
    answer: A new card arrives within 5 working days.
  - intent: exchange_rate
    answer: We use the market rate at the moment of the exchange.
"""


def write(tmp_path: Path, bot: str = BOT, rows: str = ROWS, knowledge: str = KNOWLEDGE, path: str = "train.csv") -> Path:
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "knowledge.yaml").write_text(knowledge)
    file = tmp_path / "bank.yaml"
    file.write_text(bot.format(path=path))
    (tmp_path / "actions.py").write_text("")
    return file


def test_examples_come_from_the_file_first_per_intent_after_the_intents_own(tmp_path: Path) -> None:
    bot = load_bot(write(tmp_path))
    assert bot.intent("card_arrival").examples == ["My card has not arrived yet, where is it?", "When will my new card arrive"]
    assert bot.intent("exchange_rate").examples == ["what rate do you use to exchange money", "what exchange rate do you use"]
    assert bot.intent("make_transfer").examples == ["I want to send money to someone", "send 200 to account 12345674"]


def test_with_calibrate_on_rest_the_rows_after_the_first_per_intent_only_calibrate(tmp_path: Path) -> None:
    file = write(tmp_path, bot=BOT.replace("  per_intent: 2\n", "  per_intent: 2\n  calibrate_on_rest: true\n"))
    bot = load_bot(file)
    assert bot.intent("card_arrival").examples == ["My card has not arrived yet, where is it?", "When will my new card arrive"]
    assert bot.intent("card_arrival").calibration_examples == ["still waiting for my card to come"]
    assert bot.intent("exchange_rate").calibration_examples == []  # its one row is learned from
    assert load_bot(write(tmp_path)).intent("card_arrival").calibration_examples == []  # without it the rest is left out
    with pytest.raises(BotDefinitionError, match=r"calibrate_on_rest needs per_intent"):
        load_bot(write(tmp_path, bot=BOT.replace("  per_intent: 2\n", "  calibrate_on_rest: true\n")))


def test_the_examples_path_reads_the_environment_with_a_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BANK_ROWS", raising=False)
    assert load_bot(write(tmp_path, path="${BANK_ROWS:-train.csv}")).intent("card_arrival").examples
    other = tmp_path / "elsewhere.csv"
    other.write_text("text,category\nwhere is my card,card_arrival\n")
    monkeypatch.setenv("BANK_ROWS", str(other))
    assert load_bot(write(tmp_path, path="${BANK_ROWS:-train.csv}")).intent("card_arrival").examples == ["where is my card"]
    with pytest.raises(BotDefinitionError, match=r"bank.yaml line 3: examples_file.path: .*needs the environment variable NOT_SET_HERE"):
        load_bot(write(tmp_path, path="${NOT_SET_HERE}"))


def test_bad_example_files_are_refused_with_the_line_of_the_field(tmp_path: Path) -> None:
    with pytest.raises(BotDefinitionError, match=r"line 2: examples_file: the examples file has labels no intent takes: lost_card"):
        load_bot(write(tmp_path, rows=ROWS + "I lost my card,lost_card\n"))
    with pytest.raises(BotDefinitionError, match=r"line 3: examples_file.path: .*the first row must be the header"):
        load_bot(write(tmp_path, rows="sentence,label\nhi,card_arrival\n"))
    with pytest.raises(BotDefinitionError, match=r"line 3: examples_file.path: .*No such file"):
        load_bot(write(tmp_path, path="missing.csv"))
    with pytest.raises(BotDefinitionError, match=r"intent 'card_arrival' has no examples \(nor rows of that label"):
        load_bot(write(tmp_path, rows="text,category\nwhat exchange rate do you use,exchange_rate\n"))


def test_knowledge_answers_join_their_intents_and_the_models_instructions(tmp_path: Path) -> None:
    bot = load_bot(write(tmp_path))
    assert bot.intent("card_arrival").answer == "A new card arrives within 5 working days."
    assert bot.intent("make_transfer").answer is None
    assert bot.instructions.startswith("You are a bank's assistant.\n\n")
    assert "- exchange rate: We use the market rate at the moment of the exchange." in bot.instructions


def test_bad_knowledge_is_refused_with_its_own_file_and_line(tmp_path: Path) -> None:
    unknown = KNOWLEDGE + "  - intent: opening_hours\n    answer: Nine to five.\n"
    with pytest.raises(BotDefinitionError, match=r"knowledge.yaml line 6: answers\[2\].intent: 'opening_hours': no intent of that name"):
        load_bot(write(tmp_path, knowledge=unknown))
    twice = KNOWLEDGE + "  - intent: card_arrival\n    answer: Soon.\n"
    with pytest.raises(BotDefinitionError, match=r"'card_arrival': that intent already has an answer"):
        load_bot(write(tmp_path, knowledge=twice))
    with_flow = KNOWLEDGE + "  - intent: make_transfer\n    answer: Use the app.\n"
    with pytest.raises(BotDefinitionError, match=r"intent 'make_transfer' has an answer and a flow"):
        load_bot(write(tmp_path, knowledge=with_flow))
    with pytest.raises(BotDefinitionError, match=r"bank.yaml line 5: knowledge: cannot read 'knowledge.yaml'"):
        path = write(tmp_path)
        (tmp_path / "knowledge.yaml").unlink()
        load_bot(path)


@pytest.fixture()
def bot(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_bot(write(tmp_path))


def test_a_recognised_question_gets_its_curated_answer_and_the_flow_is_done(bot, toy_embed) -> None:  # type: ignore[no-untyped-def]
    # promote_threshold=1: the intent is accepted, not confirmed; its answer is given all the same.
    decision = DialogueManager(bot, IntentClassifier(bot, toy_embed), promote_threshold=1.0).handle(None, "When will my new card arrive")
    assert decision.intent == "card_arrival" and decision.prompt == "A new card arrives within 5 working days."
    assert decision.state.state == "DONE" and decision.action is None and not decision.confirmed


def test_a_question_no_intent_fits_is_left_to_the_model(bot, toy_embed) -> None:  # type: ignore[no-untyped-def]
    decision = DialogueManager(bot, IntentClassifier(bot, toy_embed)).handle(None, "quantum chromodynamics lecture notes")
    assert decision.intent == OUT_OF_SCOPE and decision.prompt is None


def test_a_new_value_at_the_confirmation_corrects_the_slot(bot, toy_embed) -> None:  # type: ignore[no-untyped-def]
    manager = DialogueManager(bot, IntentClassifier(bot, toy_embed), promote_threshold=1.0)
    asked = manager.handle(None, "send 200 to account 12345674")
    assert asked.prompt == "Send 200 to 12345674?"
    corrected = manager.handle(asked.state, "no, make it 300")
    assert corrected.state.state == "CONFIRMING" and corrected.state.slots["amount"] == "300"
    assert corrected.prompt == "Send 300 to 12345674?"
    declined = manager.handle(corrected.state, "no")
    assert declined.state.state == "IDLE" and declined.prompt == CANCELLED_REPLY and declined.action is None


def test_never_mind_calls_the_flow_off(bot, toy_embed) -> None:  # type: ignore[no-untyped-def]
    manager = DialogueManager(bot, IntentClassifier(bot, toy_embed), promote_threshold=1.0)
    asked = manager.handle(None, "I want to send money to someone")
    assert asked.prompt == "How much would you like to send?"
    off = manager.handle(asked.state, "never mind")
    assert off.state.state == "IDLE" and off.intent == OUT_OF_SCOPE and off.prompt == CANCELLED_REPLY


def test_a_question_mid_flow_is_answered_and_the_flow_resumes(bot, toy_embed) -> None:  # type: ignore[no-untyped-def]
    manager = DialogueManager(bot, IntentClassifier(bot, toy_embed), promote_threshold=1.0)
    asked = manager.handle(None, "I want to send money to someone")
    digression = manager.handle(asked.state, "what exchange rate do you use")
    assert digression.prompt == "We use the market rate at the moment of the exchange.\n\nHow much would you like to send?"
    assert digression.state.state == "COLLECTING_SLOTS" and digression.intent == "make_transfer"
    resumed = manager.handle(digression.state, "150")
    assert resumed.state.slots == {"amount": "150"} and resumed.prompt == "Which account?"

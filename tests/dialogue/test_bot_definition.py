"""Loading bot files: the shipped bot loads, and every kind of mistake names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache.dialog import BotDefinitionError, load_bot, parse_bot

GOOD = """\
system_prompt: You are a test bot.
intents:
  - name: greet
    examples: [hello, hi there]
  - name: order
    examples:
      - I want to order
    slots: [size]
slots:
  - name: size
    values: [small, large]
flows:
  order:
    ask:
      size: Which size?
    confirm: Order a {size} one?
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(BotDefinitionError) as info:
        parse_bot(text, source="bot.yaml")
    return info.value.problems


def test_shipped_bot_loads_by_name_and_by_path(bot) -> None:
    assert [i.name for i in bot.intents] == [
        "check_balance", "transfer_money", "report_lost_card", "opening_hours", "talk_to_human"
    ]
    assert bot.intent("opening_hours").cacheable
    assert all(5 <= len(i.examples) <= 8 for i in bot.intents)
    path = Path(__file__).parents[2] / "dialog" / "bots" / "customer_service.yaml"
    assert load_bot(path) == bot


def test_good_definition_parses() -> None:
    bot = parse_bot(GOOD)
    assert bot.flow("order").confirm == "Order a {size} one?"
    assert bot.flow("greet").ask == {}


def test_missing_field_points_at_its_mapping() -> None:
    text = GOOD.replace("  - name: order\n    examples:", "  - examples:")
    assert problems_of(text) == ["bot.yaml line 5: intents[1].name: field required"]


def test_an_intent_without_examples_is_refused_at_its_line() -> None:
    text = GOOD.replace("    examples:\n      - I want to order\n", "")
    assert problems_of(text) == ["bot.yaml line 5: intents[1].examples: intent 'order' has no examples"]


def test_unknown_key_points_at_the_key() -> None:
    text = GOOD.replace("    slots: [size]\n", "    slots: [size]\n    exmaples: [oops]\n")
    assert problems_of(text) == ["bot.yaml line 9: intents[1].exmaples: extra inputs are not permitted"]


def test_wrong_type_points_at_the_value() -> None:
    text = GOOD.replace("    examples: [hello, hi there]\n", "    examples: [hello]\n    cacheable: maybe\n")
    (problem,) = problems_of(text)
    assert problem.startswith("bot.yaml line 5: intents[0].cacheable: input should be a valid boolean")


def test_yaml_syntax_error_reports_its_line() -> None:
    text = GOOD.replace("      size: Which size?", "      size: [Which size?")
    (problem,) = problems_of(text)
    assert problem.startswith("bot.yaml line 15: YAML syntax error")


def test_reference_errors_point_at_the_line() -> None:
    text = GOOD.replace("    slots: [size]", "    slots: [colour]").replace("Order a {size} one?", "Order {qty}?")
    assert problems_of(text) == [
        "bot.yaml line 8: intents[1].slots[0]: unknown slot 'colour'",
        "bot.yaml line 15: flows.order.ask.size: intent 'order' has no slot 'size'",
        "bot.yaml line 14: flows.order.ask: no prompt for slot 'colour'",
        "bot.yaml line 16: flows.order.confirm: placeholder '{qty}' is not a slot of 'order'",
    ]


def test_bad_regex_and_duplicate_keys_are_reported() -> None:
    text = GOOD.replace("    values: [small, large]", "    pattern: '(unclosed'\n    pattern: '(x'")
    problems = problems_of(text)
    assert problems[0] == "bot.yaml line 12: duplicate key 'pattern'"
    assert problems[1].startswith("bot.yaml line 12: slots[0].pattern: value error, invalid regex")


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mybot.yaml"
    path.write_text("system_prompt: hi\n")
    with pytest.raises(BotDefinitionError, match=r"^mybot.yaml line 1: intents: field required$"):
        load_bot(path)
    with pytest.raises(FileNotFoundError):
        load_bot("no_such_bot")

"""`chatcache test-bot`: a bot's conversation tests, story by story, and the failures they find."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chatcache.cli import main


STORIES = """\
stories:
  - name: opening hours
    turns:
      - user: When are you open?
        intent: opening_hours
        action: none
        bot: We are open from 9 to 5 on weekdays.
  - name: order status
    turns:
      - user: Where is my order?
        intent: order_status
      - user: it is 123456
        slots: {order_id: "123456"}
        bot: Order 123456 ships within two days.
  - name: order status, expecting the wrong question
    turns:
      - user: Where is my order?
        bot: What is your order number?
      - user: it is 123456
"""


@pytest.fixture
def bot(write_shop_bot) -> Path:  # type: ignore[no-untyped-def]
    return write_shop_bot()  # type: ignore[no-any-return]


def test_each_story_passes_or_fails_at_its_first_wrong_turn(tiny_model_dir: Path, bot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stories = tmp_path / "stories.yaml"
    stories.write_text(STORIES)
    code = main(["test-bot", str(bot), str(stories), "--model", str(tiny_model_dir), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and (report["passed"], report["total"]) == (2, 3)
    failed = report["stories"][2]
    assert not failed["passed"] and failed["turns_run"] == 1  # stopped at the wrong turn
    assert failed["failures"] == ["turn 1 ('Where is my order?'): bot said 'What is your 6-digit order number?', expected 'What is your order number?'"]
    stories.write_text(STORIES.split("  - name: order status, expecting")[0])
    assert main(["test-bot", str(bot), str(stories), "--model", str(tiny_model_dir)]) == 0
    assert "2 of 2 stories passed" in capsys.readouterr().out


def test_a_story_file_with_a_misspelt_key_is_refused_with_its_line(bot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stories = tmp_path / "broken.yaml"
    stories.write_text("stories:\n  - name: typo\n    turns:\n      - usr: hello\n")
    assert main(["test-bot", str(bot), str(stories)]) == 2
    error = capsys.readouterr().err
    assert "broken.yaml line 4" in error and "usr" in error


VISITS = """\
from chatcache.dialog import ActionContext, action
from chatcache.storage import actions_data_dir


@action("count_visit")
def count_visit(context: ActionContext) -> dict[str, str]:
    book = actions_data_dir() / "visits.txt"
    book.parent.mkdir(parents=True, exist_ok=True)
    with book.open("a") as visits:
        visits.write(context.user_id + "\\n")
    return {"count": str(len(book.read_text().splitlines()))}
"""


def test_stories_run_on_a_world_of_their_own_and_leave_the_one_users_chat_in_as_it_was(
    tiny_model_dir: Path, write_shop_bot, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    from chatcache.storage import ACTIONS_DIR_ENV, actions_data_dir

    (tmp_path / "visits.py").write_text(VISITS)
    flow = ("  opening_hours:\n    response: We are open from 9 to 5 on weekdays.\n", "  opening_hours:\n    action: count_visit\n    response: You are visitor {result.count}.\n")
    bot = write_shop_bot("actions: visits.py\n", replace=flow)
    users = actions_data_dir() / "visits.txt"  # where the bot's action keeps its count for its users
    users.parent.mkdir(parents=True)
    users.write_text("alice\nbob\n")
    stories = tmp_path / "first.yaml"
    stories.write_text("stories:\n  - name: the first visitor\n    turns:\n      - user: When are you open?\n        bot: You are visitor 1.\n")
    for _ in range(2):  # and a second run starts from a new world again
        assert main(["test-bot", str(bot), str(stories), "--model", str(tiny_model_dir)]) == 0, capsys.readouterr().out
    assert users.read_text() == "alice\nbob\n" and ACTIONS_DIR_ENV not in os.environ


def test_the_demo_bank_keeps_its_database_where_actions_keep_their_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chatcache.apps.bank import database_url
    from chatcache.storage import ACTIONS_DIR_ENV

    monkeypatch.delenv("CHATCACHE_BANK_DB", raising=False)
    monkeypatch.setenv(ACTIONS_DIR_ENV, str(tmp_path / "world"))
    assert database_url() == f"sqlite:///{tmp_path / 'world' / 'bank_demo.sqlite'}"
    monkeypatch.setenv("CHATCACHE_BANK_DB", "sqlite:///chosen.db")  # a database the user names wins
    assert database_url() == "sqlite:///chosen.db"

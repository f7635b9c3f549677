"""`chatcache test-bot`: a bot's conversation tests, story by story, and the failures they find."""

from __future__ import annotations

import json
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

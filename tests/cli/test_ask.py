"""`chatcache ask`: one turn per process, the conversation continued from the database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatcache.cli import main
from storage import SessionStore


def ask(model_dir: Path, url: str, text: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    code = main(
        ["ask", "--model", str(model_dir), "--db", url, "--session", "s1", "--json", "--no-drift",
         "--no-answer-cache", "--max-new-tokens", "6", text]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_two_calls_continue_one_conversation(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/ask.db"
    first = ask(tiny_model_dir, url, "Hello there", capsys)
    assert set(first) >= {"reply", "session", "state", "intent", "confidence", "drift", "stats"}
    assert first["session"] == "s1" and first["stats"]["generated_tokens"] == 6
    second = ask(tiny_model_dir, url, "Book a table", capsys)
    # The second process saw the first turn: its prompt is longer and starts from the stored history.
    assert second["stats"]["prompt_tokens"] > first["stats"]["prompt_tokens"] + 6
    with SessionStore(url) as store:
        assert [m.content for m in store.messages("s1") if m.role.value == "user"] == ["Hello there", "Book a table"]


def test_a_broken_bot_file_is_a_clear_error_with_its_line(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bot = tmp_path / "bot.yaml"
    bot.write_text("system_prompt: hi\nintents:\n  - name: x\n    examples: 3\n")
    code = main(["ask", "--model", str(tiny_model_dir), "--db", f"sqlite:///{tmp_path}/a.db", "--bot", str(bot), "--session", "s", "hello"])
    assert code == 2
    assert "line 4" in capsys.readouterr().err

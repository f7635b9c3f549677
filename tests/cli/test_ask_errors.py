"""`chatcache ask` on bad input: the error's message on stderr, exit status 2, no traceback, nothing recorded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatcache.cli import main
from chatcache.storage import SessionStore


def ask(model_dir: Path, *args: str) -> int:
    return main(["ask", "--model", str(model_dir), "--no-drift", "--no-answer-cache", "--max-new-tokens", "4", *args])


def test_a_garbage_database_in_the_data_dir_names_the_file_and_what_to_do(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHATCACHE_DATA_DIR", str(tmp_path))
    garbage = os.urandom(8192)
    (tmp_path / "chatcache.db").write_bytes(garbage)
    assert ask(tiny_model_dir, "--session", "s", "hello") == 2
    err = capsys.readouterr().err
    assert f"chatcache: database {tmp_path / 'chatcache.db'} is damaged" in err
    assert "move the file away" in err and "Traceback" not in err
    assert (tmp_path / "chatcache.db").read_bytes() == garbage


@pytest.mark.parametrize(
    "session, text, expected",
    [
        ("s", "a\x00b", "The message contains a NUL character"),
        ("s", "caf\udce9", "The message contains a lone surrogate"),
        ("x" * 129, "hello", "session id 'xxxx"),
        ("s\x1b[31m", "hello", "contains a control character"),
    ],
    ids=["NUL", "surrogate", "long session id", "escape in session id"],
)
def test_bad_input_is_one_line_of_explanation_and_nothing_is_recorded(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], session: str, text: str, expected: str
) -> None:
    url = f"sqlite:///{tmp_path}/ask.db"
    assert ask(tiny_model_dir, "--db", url, "--session", session, text) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    with SessionStore(url) as store:
        assert store.count_sessions() == 0


def test_a_bot_file_with_yaml_aliases_is_refused_with_its_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bot = tmp_path / "bot.yaml"
    bot.write_text("system_prompt: hi\nlol: &lol [a, a]\nintents:\n  - name: x\n    examples: *lol\n")
    assert ask(tiny_model_dir, "--db", f"sqlite:///{tmp_path}/a.db", "--bot", str(bot), "--session", "s", "hi") == 2
    assert "bot.yaml line 5: YAML alias *lol is not allowed" in capsys.readouterr().err


def test_a_missing_bot_file_is_a_message_not_a_traceback(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert ask(tiny_model_dir, "--db", f"sqlite:///{tmp_path}/a.db", "--bot", str(missing), "--session", "s", "hi") == 2
    assert f"no bot '{missing}'" in capsys.readouterr().err

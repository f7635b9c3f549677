"""`chatcache init NAME`: a new bot that loads, and whose own conversation tests pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache.cli import main


def test_a_new_bot_loads_and_passes_its_own_stories(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "demo", "--dir", str(tmp_path)]) == 0
    made = tmp_path / "demo"
    assert sorted(p.name for p in made.iterdir()) == ["README.md", "actions.py", "demo.yaml", "knowledge.yaml", "stories.yaml"]
    assert "$name" not in (made / "demo.yaml").read_text() and "demo" in (made / "README.md").read_text()
    capsys.readouterr()
    code = main(["test-bot", str(made / "demo.yaml"), str(made / "stories.yaml"), "--model", str(tiny_model_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "6 of 6 stories passed" in out


def test_init_refuses_a_bad_name_and_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "My Bot", "--dir", str(tmp_path)]) == 2
    assert "lower-case letters" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["init", "taken", "--dir", str(tmp_path)]) == 2
    assert "is not empty: nothing was written" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]

"""`chatcache ask`: one turn per process, the conversation continued from the database."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chatcache.cli import main
from chatcache.storage import SessionStore

REPO = Path(__file__).resolve().parents[2]


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


def test_ask_with_a_failing_spill_dir_prints_its_reply_and_exits_0(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`chatcache ask` spills at exit. RLIMIT_FSIZE is a real write failure (EFBIG, as when a
    disk fills up mid-file) that root cannot bypass, set in the child only: under 128 KiB the
    session's KV (about 210 KiB for this long message) cannot be written, the session database
    (about 60 KiB) can. The turn is recorded once and the process still prints its JSON."""
    limit = 128 << 10

    def limited() -> None:  # runs in the child, before it starts Python
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    url = f"sqlite:///{tmp_path}/ask.db"
    SessionStore(url).close()  # created and migrated here: the child's database writes are this turn's only
    text = " ".join(["Please book a table for two at an Italian restaurant tonight."] * 20)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHATCACHE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "chatcache.cli", "ask", "--model", str(tiny_model_dir), "--db", url,
         "--session", "s1", "--json", "--no-drift", "--no-answer-cache", "--max-new-tokens", "6", text],
        preexec_fn=limited, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["stats"]["generated_tokens"] == 6 and reply["stats"]["kv_bytes"] > limit
    assert "Could not spill" in done.stderr
    assert list((tmp_path / "data" / "kv").iterdir()) == []
    with SessionStore(url) as store:
        assert [(m.role.value, m.content) for m in store.messages("s1")] == [("user", text), ("assistant", reply["reply"])]

"""A process that ends with a reply still decoding exits cleanly and keeps what was said.

Python 3.11 ends daemon threads that wake during finalization with `pthread_exit`; the model
worker, coming back from a torch operator then, aborted the whole process (exit 134) after its
work was done, as a CI run on two long-lived engines showed. Real processes here: the abort
happens only at interpreter exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chatcache.storage import SessionStore

ROOT = Path(__file__).resolve().parents[2]

LEAVE_MID_REPLY = r"""
import sys
from chatcache import ChatEngine, TokenTierConfig
model_dir, url = sys.argv[1:3]
engine = ChatEngine(model_dir, system_prompt="You are terse.", store=url, token_tier=TokenTierConfig(spill_dir=None), device="cpu")
engine.chat("s", "a whole turn first", max_new_tokens=4)
pieces = engine.stream("s", "then one left open", max_new_tokens=400)
first = next(pieces)
assert pieces.reply is None  # the worker is still decoding this reply when the script ends
print(repr(first))
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_script_that_ends_mid_reply_exits_0_and_keeps_the_partial_reply(tiny_model_dir: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    for _ in range(2):  # the abort came every time before the fix
        done = _run(LEAVE_MID_REPLY, str(tiny_model_dir), url)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "terminate called" not in done.stderr
    with SessionStore(url) as store:
        records = store.messages("s")
    assert [r.role.value for r in records] == ["user", "assistant", "user", "assistant"] * 2
    for question, reply in zip(records[::2], records[1::2]):
        assert reply.reply_to == question.seq
    left_open = records[3::4]
    assert all(r.content for r in left_open)  # what was generated before the exit is the reply


SHORT_LIVED = r"""
import sys
from chatcache import ChatEngine, TokenTierConfig
model_dir, url, spill_dir, session, ending = sys.argv[1:6]
engine = ChatEngine(model_dir, system_prompt="You are terse.", store=url, token_tier=TokenTierConfig(spill_dir=spill_dir), device="cpu")
engine.chat(session, "hello there", max_new_tokens=4)
if ending == "mid-reply":
    pieces = engine.stream(session, "then one left open", max_new_tokens=400)
    next(pieces)
elif ending == "with":
    with engine:
        engine.chat(session, "and once more", max_new_tokens=4)
else:
    engine.chat(session, "and once more", max_new_tokens=4)
    if ending == "close":
        engine.close()
"""
ENDINGS = ("close", "with", "return", "mid-reply")


def test_short_lived_engine_processes_beside_a_busy_core_all_exit_0_and_keep_their_turns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The abort came at random, more often with the cores loaded: many short-lived processes
    (a turn or two, then exit, each way a script ends: `close()`, `with`, simply returning,
    returning mid-reply), two at a time, beside a process that keeps one core busy. Every one
    exits 0 with nothing from the C++ runtime, keeps both its turns in the database, and, since
    an engine still open at exit is closed then, leaves its session's KV spilled on disk."""
    url, spill_dir = f"sqlite:///{tmp_path / 'chat.db'}", tmp_path / "kv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    runs = [(f"s{n}", ENDINGS[n % len(ENDINGS)]) for n in range(8)]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for pair in (runs[n : n + 2] for n in range(0, len(runs), 2)):
            started = [
                (session, ending, subprocess.Popen(
                    [sys.executable, "-c", SHORT_LIVED, str(tiny_model_dir), url, str(spill_dir), session, ending],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                ))
                for session, ending in pair
            ]  # fmt: skip
            for session, ending, process in started:
                _, err = process.communicate(timeout=300)
                assert process.returncode == 0, f"{session} ({ending}): exit {process.returncode}\n{err[-2000:]}"
                assert "terminate called" not in err, f"{session} ({ending}): {err[-2000:]}"
    finally:
        hog.kill()
        hog.wait()
    with SessionStore(url) as store:
        for session, ending in runs:
            records = store.messages(session)
            assert [r.role.value for r in records] == ["user", "assistant"] * 2, (session, ending)
            assert all(r.content for r in records), (session, ending)
    spilled = {path.name for path in spill_dir.glob("*.safetensors")}
    assert len(spilled) == len(runs)  # one file a session: none lost at exit, whichever way the script ended

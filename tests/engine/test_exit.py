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

from storage import SessionStore

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

"""Turns on one session from several processes at once never interleave, and none answers on a stale copy.

Real processes on one database (SQLite file or PostgreSQL): long-lived engines that start
their turns at the same moment, and one-shot `chatcache ask` processes launched together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import URL

from chatcache import load_chat_model
from chatcache.model.prompt import Message, PromptRenderer, RenderedSegments
from chatcache.storage import SessionStore

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are terse."

ENGINE_WORKER = r"""
import json, sys, time
from pathlib import Path
from chatcache import ChatEngine, TokenTierConfig
model_dir, url, tag, turns, barrier, workers = sys.argv[1:7]
engine = ChatEngine(model_dir, system_prompt=%r, store=url, token_tier=TokenTierConfig(spill_dir=None), device="cpu")
Path(barrier, tag).touch()
while len(list(Path(barrier).iterdir())) < int(workers):
    time.sleep(0.005)
out = []
for i in range(int(turns)):
    text = f"question {i} from {tag}"
    reply = engine.chat("shared", text, max_new_tokens=4)
    out.append({"text": text, "prompt_tokens": reply.stats.prompt_tokens})
print(json.dumps(out))
""" % SYSTEM


def _url(store_url: str | URL) -> str:
    return store_url.render_as_string(hide_password=False) if isinstance(store_url, URL) else store_url


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def _check_record(url: str, model_dir: Path, questions: set[str]) -> dict[str, int]:
    """Every question once, each followed by its own reply; returns the prompt size each question
    has when the turns stored before it are all in its prompt."""
    with SessionStore(url) as store:
        records = store.messages("shared")
    assert [r.role.value for r in records] == ["user", "assistant"] * len(questions)
    assert {r.content for r in records if r.role.value == "user"} == questions
    for question, reply in zip(records[::2], records[1::2]):
        assert reply.reply_to == question.seq
    renderer = PromptRenderer(load_chat_model(str(model_dir), device="cpu").tokenizer)
    history: list[Message] = [Message("system", SYSTEM)]
    expected = {}
    for question, reply in zip(records[::2], records[1::2]):
        asked = Message("user", question.content)
        expected[question.content] = len(renderer.conversation_ids([*history, asked], RenderedSegments()))
        history += [asked, Message("assistant", reply.content, tuple((reply.meta or {})["token_ids"]))]
    return expected


def test_long_lived_engines_in_several_processes_take_turns(store_url, tiny_model_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, workers, turns = _url(store_url), 2, 3
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    SessionStore(url).close()  # migrate once, before the race
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENGINE_WORKER, str(tiny_model_dir), url, f"w{n}", str(turns), str(barrier), str(workers)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )
        for n in range(workers)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
    answered = [turn for out, _ in results for turn in json.loads(out.strip().splitlines()[-1])]
    prompt_tokens = {turn["text"]: turn["prompt_tokens"] for turn in answered}
    # A process answering on a stale copy would leave the other processes' turns out of its prompt.
    assert prompt_tokens == _check_record(url, tiny_model_dir, set(prompt_tokens))


def test_chatcache_ask_processes_launched_together_take_turns(store_url, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    url = _url(store_url)
    SessionStore(url).close()
    questions = {f"one-shot question {n}" for n in range(3)}
    command = "import sys; from chatcache.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", command, "ask", "--model", str(tiny_model_dir), "--db", url, "--session", "shared",
             "--system", SYSTEM, "--json", "--no-drift", "--no-answer-cache", "--max-new-tokens", "4", question],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )
        for question in sorted(questions)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
    prompt_tokens = sorted(json.loads(out.strip().splitlines()[-1])["stats"]["prompt_tokens"] for out, _ in results)
    assert prompt_tokens == sorted(_check_record(url, tiny_model_dir, questions).values())

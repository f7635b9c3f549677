"""Run a bot's conversation tests (`dialog.stories`): `chatcache test-bot BOT [FILE...]`; without
files, the stories that come with the bot (`dialog.loader.default_stories`).

Each story runs in a new session of one engine on the bot, with the answer cache off (a story
must not pass because an earlier one left an answer behind) and drift detection on, as the bot
runs for its users. Its turns are sent in order and every expectation given is checked against
the reply and the session's stored dialogue state; a story stops at its first failing turn,
since the turns after it depend on it. Actions run for real, as they would in the bot, on a
world of the run's own (`$CHATCACHE_ACTIONS_DIR` in a scratch directory: the demo bank's
database is new, whatever the user's own chats with the bot did to theirs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from chatcache.dialog import ActionError, BotDefinitionError, load_stories
from chatcache.dialog.loader import default_stories
from chatcache.dialog.stories import ExpectedAction, Story, StoryTurn
from chatcache.storage import ACTIONS_DIR_ENV

from ..engine import ChatEngine
from ..errors import ChatCacheError
from ..reply import Reply
from ..tiers.conversations import stored_dialogue


@dataclass(frozen=True)
class StoryResult:
    name: str
    passed: bool
    turns_run: int
    failures: list[str]


def run_story(engine: ChatEngine, story: Story, session_id: str, max_new_tokens: int) -> StoryResult:
    """Send the story's turns in `session_id` (a new session) and check each as it comes back."""
    failures: list[str] = []
    number = 0
    for number, turn in enumerate(story.turns, 1):
        reply = engine.chat(session_id, turn.user, max_new_tokens=max_new_tokens)
        dialogue = stored_dialogue(session_id, engine.store.get_session(session_id).state)
        slots = dict(dialogue.slots) if dialogue is not None else {}
        failures = [f"turn {number} ({turn.user!r}): {problem}" for problem in mismatches(turn, reply, slots)]
        if failures:
            break
    return StoryResult(story.name, not failures, number, failures)


def mismatches(turn: StoryTurn, reply: Reply, slots: dict[str, str]) -> list[str]:
    """What the reply (and the session's slots) got wrong of what the turn expects."""
    problems = []
    if turn.intent is not None and reply.intent != turn.intent:
        problems.append(f"intent {reply.intent!r}, expected {turn.intent!r}")
    if turn.slots is not None and any(slots.get(name) != value for name, value in turn.slots.items()):
        problems.append(f"slots {({name: slots.get(name) for name in turn.slots})}, expected {turn.slots}")
    ran = reply.action
    if turn.action == "none" and ran is not None:
        problems.append(f"action {ran.name!r} ran, expected none")
    elif isinstance(turn.action, ExpectedAction):
        wanted = turn.action
        if ran is None:
            problems.append(f"no action ran, expected {wanted.name!r}")
        elif ran.name != wanted.name or any(ran.arguments.get(k) != v for k, v in wanted.arguments.items()):
            problems.append(f"action {ran.name!r} with {ran.arguments}, expected {wanted.name!r} with {wanted.arguments}")
    if turn.bot is not None and reply.text != turn.bot:
        problems.append(f"bot said {reply.text!r}, expected {turn.bot!r}")
    if turn.handed_off is not None and reply.handed_off != turn.handed_off:
        problems.append(f"handed off: {reply.handed_off}, expected {turn.handed_off}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """`chatcache test-bot`: 0 when every story passes, 1 when one fails, 2 for a file that cannot be used."""
    parser = argparse.ArgumentParser(prog="chatcache test-bot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bot", help="the bot: a YAML file or a shipped bot name")
    parser.add_argument("files", nargs="*", help="story files (YAML); default: the stories beside the bot")
    parser.add_argument("--model", default="bundled", help="'bundled', a Hugging Face model id or a local path")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="reply length of the turns the model answers")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        files = args.files or [str(default_stories(args.bot))]
        stories = [(path, story) for path in files for story in load_stories(path).stories]
    except (BotDefinitionError, OSError) as error:
        print(f"chatcache test-bot: {error}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory() as scratch, _actions_kept_in(Path(scratch) / "actions"):
        try:
            engine = ChatEngine(args.model, bot=args.bot, store=f"sqlite:///{scratch}/stories.db", drift=True)
        except (BotDefinitionError, ActionError, ChatCacheError, FileNotFoundError) as error:
            print(f"chatcache test-bot: {error}", file=sys.stderr)
            return 2
        with engine:
            for index, (path, story) in enumerate(stories):
                results.append((path, run_story(engine, story, f"story-{index + 1}", args.max_new_tokens)))
    passed = sum(result.passed for _, result in results)
    if args.json:
        print(json.dumps({"passed": passed, "total": len(results), "stories": [{"file": path, **asdict(r)} for path, r in results]}))
    else:
        for path, result in results:
            print(f"{'PASS' if result.passed else 'FAIL'}  {result.name}  ({path}, {result.turns_run} turns)")
            for failure in result.failures:
                print(f"      {failure}")
        print(f"{passed} of {len(results)} stories passed")
    return 0 if passed == len(results) else 1


@contextlib.contextmanager
def _actions_kept_in(directory: Path) -> Iterator[None]:
    """Bots' actions keep their data in `directory` while the block runs (`actions_data_dir`)."""
    before = os.environ.get(ACTIONS_DIR_ENV)
    os.environ[ACTIONS_DIR_ENV] = str(directory)
    try:
        yield
    finally:
        if before is None:
            del os.environ[ACTIONS_DIR_ENV]
        else:
            os.environ[ACTIONS_DIR_ENV] = before

"""The `chatcache` command: chat, ask (one turn, then exit), serve (HTTP), test-bot and eval."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used, so `chatcache --help` starts without torch
    from chatcache import AnswerCacheConfig, ChatEngine, ChatModel

DEFAULT_SYSTEM_PROMPT = "You are a helpful, concise assistant."
PRECISIONS = ("exact", "int8")  # chatcache.model.loading's, named here so that --help does not import torch
PRECISION_HELP = (
    "a local model's products: exact (default) or int8 (CPU only: about 2x faster decode, reused KV still"
    " exact, replies a little different from exact ones)"
)
COMPILED_DECODE_HELP = (
    "compile a local model's decode step with inductor (exact precision only; on the CPU a step of 8 conversations"
    " about 1.4x as fast, the same greedy replies), for a second copy of the weights and two compiles before the"
    " first reply: about a minute each the first time, about 10 s each once cached in the data dir"
)
MAX_ERROR_RATE_HELP = (
    "the share of answers the answer cache serves by meaning that may be wrong, in (0, 0.5), e.g. 0.01;"
    " a scope without the evidence to hold it serves exact repeats only (default: fixed thresholds, no bound)"
)
KV_KEY_FILE_HELP = (
    "the keys that sign spilled KV, one a line, newest first (default: $CHATCACHE_KV_KEY, else a key generated"
    " in the data dir); replicas sharing a KV dir need the same keys"
)


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="bundled",
        help="'bundled', a Hugging Face model id, a local path, or an OpenAI-compatible server's address "
        "(http://127.0.0.1:8080/v1, or ...#NAME when it serves several models)",
    )
    parser.add_argument("--tokenizer", default=None, help="a server's model: its tokenizer here ('bundled', an id or a path)")
    parser.add_argument("--context-window", type=int, default=None, help="a server's model: its context size in tokens")
    parser.add_argument("--precision", choices=PRECISIONS, default="exact", help=PRECISION_HELP)
    parser.add_argument("--compiled-decode", action="store_true", help=COMPILED_DECODE_HELP)
    parser.add_argument("--system", default=None, help="system prompt (default: the bot's, or a generic one)")
    parser.add_argument("--db", default=None, help="SQLAlchemy URL of the session database (default: SQLite in the data dir)")
    parser.add_argument("--bot", default=None, help="bot definition: a YAML file or a shipped bot name")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--no-drift", action="store_true", help="do not detect topic changes")
    answer_cache = parser.add_mutually_exclusive_group()
    answer_cache.add_argument("--no-answer-cache", action="store_true", help="always run the model")
    answer_cache.add_argument("--max-error-rate", type=float, default=None, help=MAX_ERROR_RATE_HELP)
    parser.add_argument(
        "--user",
        default=None,
        help="whose sessions to use (default: 'app' in the chat app, 'local' for ask, --plain and Python scripts)",
    )


def _answer_cache_flags(parser: argparse.ArgumentParser) -> None:
    """The answer cache's bound, for `serve` and for every replica of `cluster up`."""
    parser.add_argument("--answer-cache-max-error-rate", type=float, default=None, help=MAX_ERROR_RATE_HELP)
    parser.add_argument("--answer-cache-confidence", type=float, default=None, help="how sure that bound is, in [0.5, 1) (default 0.95)")
    parser.add_argument(
        "--answer-cache-audit-rate", type=float, default=None,
        help="the share of cached answers the model answers again to check the bound on live questions (default 0: unwatched)",
    )  # fmt: skip


def _answer_cache(args: argparse.Namespace) -> bool | AnswerCacheConfig:
    """What the engine's `answer_cache` is given: a bad --max-error-rate raises ConfigError here,
    before the model loads."""
    if args.no_answer_cache:
        return False
    if args.max_error_rate is None:
        return True
    from .answer_cache.config import AnswerCacheConfig

    return AnswerCacheConfig(max_error_rate=args.max_error_rate)


def _evaluation(name: str) -> Callable[[list[str]], int]:
    if name == "drift":
        from .evals.drift import main as run
    elif name == "answer-cache":
        from .evals.answer_cache import main_answer_cache as run
    elif name == "intents":
        from .evals.intents import main as run
    elif name == "polarity":
        from .evals.polarity import main as run
    elif name == "context":
        from .evals.context import main as run
    elif name == "tools":
        from .evals.tools import main as run
    elif name == "followups":
        from .evals.followups import main as run
    else:
        from .evals.answer_cache_pairs import main_pairs as run
    return run


EVALUATIONS = ("drift", "answer-cache", "pairs", "intents", "polarity", "context", "tools", "followups")
LISTED_INTENTS = 8  # `chatcache bots` names a bot's first intents, then counts the rest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatcache", description="Chatbots on local models, with a hierarchical cache.")
    commands = parser.add_subparsers(dest="command", required=True)
    chat = commands.add_parser("chat", help="chat in the terminal with the bundled model (or --model)")
    _engine_options(chat)
    chat.add_argument("--session", default=None, help="session id to continue (default: a new conversation)")
    chat.add_argument("--plain", action="store_true", help="line mode, for pipes and non-TTY use")
    ask = commands.add_parser("ask", help="answer one message in a session, then exit")
    _engine_options(ask)
    ask.add_argument("--session", required=True, help="session id; the conversation continues from the database")
    ask.add_argument("--json", action="store_true", help="print one JSON object")
    ask.add_argument("text", help="the user's message")
    serve = commands.add_parser("serve", help="serve the bot over HTTP: OpenAI-compatible API, sessions, metrics, a chat page")
    serve.add_argument("--config", type=Path, default=None, help="YAML file of settings (below flags and CHATCACHE_* variables)")
    serve.add_argument("--bot", default=None, help="bot definition: a YAML file or a shipped bot name")
    serve.add_argument("--model", default=None, help="'bundled' (default), a Hugging Face model id or a local path")
    serve.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    serve.add_argument("--compiled-decode", action="store_true", default=None, help=COMPILED_DECODE_HELP)
    serve.add_argument("--db", default=None, help="SQLAlchemy URL of the session database (default: SQLite in the data dir)")
    serve.add_argument("--kv-dir", type=Path, default=None, help="where cold sessions' KV is spilled (default: kv/ in the data dir)")
    serve.add_argument("--kv-key-file", type=Path, default=None, help=KV_KEY_FILE_HELP)
    serve.add_argument("--system", dest="system_prompt", default=None, help="system prompt (default: the bot's, or a generic one)")
    serve.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--ttft-slo", type=float, default=None, help="refuse (429) requests predicted to wait longer for their first token (seconds)")
    serve.add_argument("--max-queue", type=int, default=None, help="refuse (429) when this many requests wait for the model (default 64)")
    serve.add_argument("--api-key-file", type=Path, default=None, help="one 'KEY TENANT [ROLE]' per line (ROLE customer, the default, or agent); then every request needs a key")
    serve.add_argument("--rate-limit", type=float, default=None, help="requests per second per API key")
    serve.add_argument("--busy-session", choices=("wait", "reject"), default=None, help="a session's message while its turn runs: wait (default) or 409")
    serve.add_argument("--drain-seconds", type=float, default=None, help="on SIGTERM, how long running turns may take to finish (default 30)")
    _answer_cache_flags(serve)
    cluster = commands.add_parser("cluster", help="replicas of `serve` on one PostgreSQL behind HAProxy, on this machine: up, status, down")
    cluster_actions = cluster.add_subparsers(dest="action", required=True)
    cluster_up = cluster_actions.add_parser("up", help="start PostgreSQL, N replicas and the router; print the router's URL")
    cluster_up.add_argument("--replicas", type=int, default=2, help="how many `chatcache serve` processes (default 2)")
    cluster_up.add_argument("--port", type=int, default=8000, help="the router's port (default 8000)")
    cluster_up.add_argument("--db", default=None, help="a PostgreSQL URL to use instead of starting one")
    cluster_up.add_argument("--bot", default=None, help="each replica's bot: a YAML file or a shipped bot name")
    cluster_up.add_argument("--model", default=None, help="each replica's model: 'bundled' (default), a model id or a path")
    cluster_up.add_argument("--kv-key-file", type=Path, default=None, help=KV_KEY_FILE_HELP + "; default: one generated for the cluster")
    _answer_cache_flags(cluster_up)
    cluster_status = cluster_actions.add_parser("status", help="each replica's URL and process id, the router's, the database URL")
    cluster_status.add_argument("--json", action="store_true", help="print one JSON object")
    cluster_actions.add_parser("down", help="stop the replicas (they drain and spill), the router and the database")
    commands.add_parser("bots", help="list the shipped bots (what --bot NAME accepts besides a YAML file)")
    train = commands.add_parser("train", help="train a bot's intent model on its examples (its `training` settings)")
    train.add_argument("bot", help="a bot YAML file or a shipped bot name")
    train.add_argument("--force", action="store_true", help="train again even when a model for these examples is stored")
    commands.add_parser("test-bot", help="run a bot's conversation tests: chatcache test-bot BOT [FILE...] (see --help)", add_help=False)
    init = commands.add_parser("init", help="start a new bot: its YAML, actions module, conversation tests and README")
    init.add_argument("name", help="the bot's name, also its directory's")
    init.add_argument("--dir", type=Path, default=Path("."), help="where its directory goes (default: here)")
    evaluate = commands.add_parser("eval", help="evaluations on labelled data: drift, answer-cache, pairs, intents, followups, polarity, context, tools")
    evaluate.add_argument("evaluation", choices=sorted(EVALUATIONS), help="see `chatcache eval NAME --help`")
    return parser


def _engine_factory(args: argparse.Namespace, user_id: str = "local") -> Callable[[str | None], ChatEngine]:
    """Engines for one model: the chat app builds a new one when the user switches bots."""
    answer_cache = _answer_cache(args)
    from chatcache import ChatEngine, ConfigError, load_chat_model
    from chatcache.model.remote import RemoteModel, connect_remote_model, is_remote

    model: ChatModel | RemoteModel
    if is_remote(args.model):
        if args.compiled_decode:
            raise ConfigError("--compiled-decode compiles a local model's decode step: a model served elsewhere decodes on its server")
        model = connect_remote_model(args.model, tokenizer=args.tokenizer, context_window=args.context_window)
    else:
        model = load_chat_model(args.model, precision=args.precision, compiled_decode=args.compiled_decode)

    def build(bot: str | None) -> ChatEngine:
        system = args.system or (None if bot else DEFAULT_SYSTEM_PROMPT)
        return ChatEngine(
            model,
            system_prompt=system,
            store=args.db,
            bot=bot,
            drift=not args.no_drift,
            answer_cache=answer_cache,
            user_id=args.user or user_id,
        )

    return build


def _build_engine(args: argparse.Namespace) -> ChatEngine:
    return _engine_factory(args)(args.bot)


def _ask(args: argparse.Namespace) -> int:
    with _build_engine(args) as engine:
        reply = engine.chat(args.session, args.text, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(
            json.dumps(
                {
                    "reply": reply.text,
                    "session": reply.session_id,
                    "state": reply.dialogue_state,
                    "intent": reply.intent,
                    "confidence": reply.confidence,
                    "action": reply.action.as_dict() if reply.action is not None else None,
                    "handed_off": reply.handed_off,
                    "drift": reply.stats.drift,
                    "stats": reply.stats.as_dict(),
                }
            )
        )
    else:
        print(reply.text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Validate the settings before the model loads, then serve until SIGTERM or Ctrl-C drains and stops it."""
    import uvicorn
    from pydantic import ValidationError

    from .serving import ServeSettings, create_app
    from .serving.keys import KeyFileError

    flags = {name: getattr(args, name) for name in (
        "bot", "model", "precision", "compiled_decode", "db", "kv_dir", "kv_key_file", "system_prompt", "host", "port", "ttft_slo", "max_queue", "api_key_file", "rate_limit",
        "busy_session", "drain_seconds", "answer_cache_max_error_rate", "answer_cache_confidence", "answer_cache_audit_rate",
    )}  # fmt: skip
    try:
        settings = ServeSettings.load(args.config, **flags)
        settings.keys()
    except (ValidationError, KeyFileError, ValueError) as error:
        print(f"chatcache serve: {error}", file=sys.stderr)
        return 2
    _check_bot(settings.bot)
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port,
        timeout_graceful_shutdown=int(math.ceil(settings.drain_seconds)), log_level="info",
    )  # fmt: skip
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _stopped)  # uvicorn raises the signal again once it has drained and shut down
    uvicorn.Server(config).run()
    return 0


def _stopped(signum: int, frame: object) -> None:
    """A stop asked for by a signal ends the process with 0 (the graceful shutdown is what was
    asked for), through the interpreter's own exit, so everything closed at exit is closed."""
    raise SystemExit(0)


def _cluster(args: argparse.Namespace) -> int:
    from chatcache.dialog import BotDefinitionError

    from . import cluster
    from .errors import ConfigError

    if args.action == "status":
        report = cluster.status()
        if args.json:
            print(json.dumps(report))
        elif not report["up"]:
            print("no cluster is up")
        else:
            print(f"router {report['url']} (pid {report['router']['pid']}), database {report['database_url']}")
            for replica in report["replicas"]:
                print(f"{replica['name']} {replica['url']} pid {replica['pid']}: {'ready' if replica['ready'] else 'alive' if replica['alive'] else 'dead'}")
        return 0
    if args.action == "down":
        print("stopped" if cluster.down() else "no cluster is up")
        return 0
    options = [*(["--bot", args.bot] if args.bot else []), *(["--model", args.model] if args.model else [])]
    try:
        options += _replica_answer_cache_flags(args)
        _check_bot(args.bot)
        state = cluster.up(args.replicas, args.port, args.db, options, kv_key_file=args.kv_key_file)
    except (ConfigError, BotDefinitionError, RuntimeError) as error:
        print(f"chatcache cluster up: {error}", file=sys.stderr)
        return 2
    print(state.router.url)
    return 0


def _replica_answer_cache_flags(args: argparse.Namespace) -> list[str]:
    """The answer-cache flags `cluster up` was given, as each replica's `serve` takes them.

    Raises:
        ConfigError: a value `AnswerCacheConfig` refuses, before any replica starts (each would
            refuse it on its own, once the database and the others were up).
    """
    from .answer_cache.config import AnswerCacheConfig

    given = [
        ("--answer-cache-max-error-rate", "max_error_rate", args.answer_cache_max_error_rate),
        ("--answer-cache-confidence", "bound_confidence", args.answer_cache_confidence),
        ("--answer-cache-audit-rate", "audit_rate", args.answer_cache_audit_rate),
    ]
    AnswerCacheConfig(**{field: value for _, field, value in given if value is not None})
    return [item for flag, _, value in given if value is not None for item in (flag, str(value))]


def _offline_by_default() -> None:
    """Keep the hub offline unless the user says otherwise (HF_HUB_OFFLINE=0 downloads models).

    huggingface_hub reads HF_HUB_OFFLINE once, when it is imported, so this runs before
    anything imports it (the `chatcache` package imports its modules lazily for this). Offline,
    a model name that is neither local nor in the HF cache fails at once with our message,
    instead of after about a minute of retries against an unreachable hub.
    """
    if "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ:
        os.environ["HF_HUB_OFFLINE"] = "1"


def _check_bot(bot: str | None) -> None:
    """Fail on a wrong --bot before the model loads (which takes seconds), naming the shipped bots.

    Raises:
        BotDefinitionError: no such file or shipped bot, or the file is not a valid bot.
    """
    if bot is None:
        return
    from chatcache.dialog import BotDefinitionError, load_bot, shipped_bots

    try:
        load_bot(bot)
    except FileNotFoundError:
        raise BotDefinitionError(
            [
                f"no bot {bot!r}: it is neither a bot YAML file nor a shipped bot. "
                f"Shipped bots: {', '.join(shipped_bots())} (`chatcache bots` lists them)."
            ]
        ) from None


def _train(bot_name: str, force: bool) -> int:
    """`chatcache train BOT`: 0 with the model stored (or already there), 2 for a bot that cannot be used."""
    from chatcache.dialog import BotDefinitionError, load_bot

    from .intents.trained import calibration_examples, find_trained, training_examples
    from .intents.training import train_intent_model

    try:
        _check_bot(bot_name)
        bot = load_bot(bot_name)
    except BotDefinitionError as exc:
        print(f"chatcache: {exc}", file=sys.stderr)
        return 2
    stored = find_trained(bot)
    if stored is not None and not force:
        print(f"A model trained on these examples is stored: {stored} (--force trains it again).")
        return 0
    try:
        directory = train_intent_model(training_examples(bot), bot.training, calibration=calibration_examples(bot))
    except ValueError as exc:
        print(f"chatcache train: {exc}", file=sys.stderr)
        return 2
    print(f"Trained: {directory}. `chatcache chat --bot {bot_name}` reads its intents with it.")
    return 0


def _list_bots() -> int:
    from chatcache.dialog import load_bot, shipped_bots

    for name in shipped_bots():
        intents = [intent.name for intent in load_bot(name).intents]
        shown = ", ".join(intents[:LISTED_INTENTS]) + (f" and {len(intents) - LISTED_INTENTS} more" if len(intents) > LISTED_INTENTS else "")
        print(f"{name}: {len(intents)} intents ({shown})")
    print("Use one with --bot NAME, or pass --bot path/to/bot.yaml (see dialog/bots/ for the format).")
    return 0


def _init(name: str, parent: Path) -> int:
    from chatcache.dialog.scaffold import ScaffoldError, scaffold

    try:
        written = scaffold(name, parent)
    except (ScaffoldError, OSError) as error:
        print(f"chatcache init: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    bot, stories = written[0], written[2]
    print(f"Next: chatcache chat --bot {bot}   ·   chatcache test-bot {bot} {stories}")
    return 0


def main(argv: list[str] | None = None) -> int:
    _offline_by_default()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test-bot"]:  # parses its own options, as the evaluations do
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
        from .evals.stories import main as test_bot

        return test_bot(argv[1:])
    if len(argv) >= 2 and argv[0] == "eval" and argv[1] in EVALUATIONS:
        # Each evaluation parses its own options (`chatcache eval pairs --tsv ... --json`).
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
        return _evaluation(argv[1])(argv[2:])
    args = _parser().parse_args(argv)
    if args.command == "bots":
        return _list_bots()
    if args.command == "init":
        return _init(args.name, args.dir)
    if args.command == "train":
        return _train(args.bot, args.force)
    if args.command == "cluster":
        return _cluster(args)
    quiet = getattr(args, "json", False)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    from chatcache import ChatCacheError, StorageError
    from chatcache.dialog import BotDefinitionError

    try:
        _check_bot(args.bot)
        if args.command == "ask":
            return _ask(args)
        if args.command == "serve":
            return _serve(args)
        if args.plain or not sys.stdin.isatty() or not sys.stdout.isatty():
            from chatcache.apps.plain_chat import run_plain_chat

            engine = _build_engine(args)
            try:
                return run_plain_chat(engine, args.session or "default", args.max_new_tokens, sys.stdin, sys.stdout)
            finally:
                engine.close()
        from chatcache.apps.tui import APP_USER, run_tui

        return run_tui(_engine_factory(args, APP_USER), session_id=args.session, bot=args.bot, max_new_tokens=args.max_new_tokens)
    except (ChatCacheError, StorageError, BotDefinitionError) as exc:
        print(f"chatcache: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

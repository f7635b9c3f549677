"""The `chatcache` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys

DEFAULT_SYSTEM_PROMPT = "You are a helpful, concise assistant."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatcache", description="Chatbots on local models, with a hierarchical cache.")
    commands = parser.add_subparsers(dest="command", required=True)
    chat = commands.add_parser("chat", help="chat in the terminal with the bundled model (or --model)")
    chat.add_argument("--model", default="bundled", help="'bundled', a Hugging Face model id or a local path")
    chat.add_argument("--system", default=DEFAULT_SYSTEM_PROMPT, help="system prompt")
    chat.add_argument("--session", default="default", help="session id")
    chat.add_argument("--max-new-tokens", type=int, default=256)
    chat.add_argument("--plain", action="store_true", help="line mode, for pipes and non-TTY use")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from apps.plain_chat import run_plain_chat
    from chatcache import ChatCacheError, ChatEngine

    try:
        engine = ChatEngine(args.model, system_prompt=args.system)
    except ChatCacheError as exc:
        print(f"chatcache: {exc}", file=sys.stderr)
        return 2
    return run_plain_chat(engine, args.session, args.max_new_tokens, sys.stdin, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())

"""Line-mode chat: one prompt per line on stdin, the reply streamed to stdout.

Works in pipes and over any terminal; it is what `chatcache chat` runs until the Textual app
lands, and what `chatcache chat --plain` keeps running after.
"""

from __future__ import annotations

import sys
from typing import TextIO

from chatcache import ChatEngine, ChatCacheError


def run_plain_chat(engine: ChatEngine, session_id: str, max_new_tokens: int, stdin: TextIO, stdout: TextIO) -> int:
    """Chat until end of input or `/quit`; returns the process exit code."""
    interactive = stdin.isatty()
    if interactive:
        stdout.write("chatcache: type a message, /stats for cache figures, /quit to leave.\n")
    while True:
        if interactive:
            stdout.write("\nyou> ")
            stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            return 0
        if line.strip() == "/stats":
            stdout.write(f"{engine.kv_stats()}\n")
            continue
        if not line.strip():
            continue
        stdout.write("bot> " if interactive else "")
        try:
            with engine.stream(session_id, line.rstrip("\n"), max_new_tokens=max_new_tokens) as stream:
                for piece in stream:
                    stdout.write(piece)
                    stdout.flush()
        except ChatCacheError as exc:
            stdout.write(f"[error] {exc}\n")
            continue
        except KeyboardInterrupt:  # leaving the `with` block cancelled the turn
            stdout.write(" [cancelled]")
        reply = stream.reply
        stdout.write("\n")
        if interactive and reply is not None:
            s = reply.stats
            drafts = f", {s.accepted_tokens}/{s.drafted_tokens} drafted tokens kept" if s.drafted_tokens else ""
            sys.stderr.write(
                f"  [{s.tier}: reused {s.reused_tokens}/{s.prompt_tokens} tokens, "
                f"ttft {s.ttft_s * 1000:.0f} ms, {s.decode_tokens_per_s:.1f} tok/s{drafts}]\n"
            )

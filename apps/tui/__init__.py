"""The Textual terminal chat app: `run_tui(engine)` opens it (`chatcache chat`)."""

from .app import APP_USER, ChatApp, run_tui

__all__ = ["APP_USER", "ChatApp", "run_tui"]

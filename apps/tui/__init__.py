"""The Textual terminal chat app: `run_tui(engine)` opens it (`chatcache chat`)."""

from .app import ChatApp, run_tui

__all__ = ["ChatApp", "run_tui"]

"""Rename the open session."""

from __future__ import annotations

from .ask import AskScreen


class RenameScreen(AskScreen):
    """Asks for the session's new title; an empty title shows the session id again."""

    def __init__(self, title: str) -> None:
        super().__init__("Rename session", value=title, placeholder="a title for this session")

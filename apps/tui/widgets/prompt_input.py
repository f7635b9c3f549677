"""The message input, with shell-like history on up and down."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.widgets import Input


class PromptInput(Input):
    """An `Input` that remembers what was sent; up and down walk through it.

    What was being typed before walking the history comes back after the newest entry.
    """

    BINDINGS = [
        Binding("up", "history_previous", "Previous message", show=False),
        Binding("down", "history_next", "Next message", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:  # Input's keyword arguments
        super().__init__(**kwargs)
        self.history: list[str] = []
        self._position: int | None = None  # index into history while walking it
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._position = None

    def set_history(self, items: list[str]) -> None:
        self.history = []
        for item in items:
            self.remember(item)

    def action_history_previous(self) -> None:
        if not self.history:
            return
        if self._position is None:
            self._draft, self._position = self.value, len(self.history)
        self._position = max(self._position - 1, 0)
        self._show(self.history[self._position])

    def action_history_next(self) -> None:
        if self._position is None:
            return
        self._position += 1
        if self._position >= len(self.history):
            self._position = None
            self._show(self._draft)
        else:
            self._show(self.history[self._position])

    def _show(self, text: str) -> None:
        self.value = text
        self.cursor_position = len(text)

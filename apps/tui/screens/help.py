"""The help screen: every key of the app, taken from its bindings so it never goes stale."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

INPUT_KEYS = [("Enter", "Send the message"), ("Up / Down", "Previous / next sent message")]


class HelpScreen(ModalScreen[None]):
    """Keys as a two-column list; Esc, q, ? or F1 closes it."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "app.pop_screen", "Close")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = INPUT_KEYS + keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog"):
            yield Label("chatcache keys", classes="question")
            yield Static("\n".join(f"{key:<12}{what}" for key, what in self.keys), markup=False)
            yield Label("Every command is also in the palette (Ctrl+P). Esc closes this.", classes="hint")

"""One chat message, rendered as Markdown and streamed piece by piece while the model writes it."""

from __future__ import annotations

import re

from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

# A model can emit any byte; C0 control characters (other than tab and newline) could act as
# terminal escapes over SSH, so they are dropped before anything is shown.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

ROLE_LABELS = {"user": "you", "assistant": "bot", "system": "system"}


def printable(text: str) -> str:
    """`text` without control characters, safe to put on a terminal."""
    return _CONTROL.sub("", text)


class ChatMessage(Markdown):
    """A user or assistant message; `text` is what has been shown so far."""

    def __init__(self, role: str, text: str = "") -> None:
        self.role = str(role)
        self.text = printable(text)
        super().__init__(self.text, classes=f"-{self.role}")
        self.border_title = ROLE_LABELS.get(self.role, self.role)
        self._stream: MarkdownStream | None = None

    async def add_piece(self, piece: str) -> None:
        """Append a streamed piece of the reply (Textual batches fast writes into one update)."""
        piece = printable(piece)
        if not piece:
            return
        self.text += piece
        if self._stream is None:
            self._stream = Markdown.get_stream(self)
        await self._stream.write(piece)

    async def finish(self, note: str | None = None, failed: bool = False) -> None:
        """End streaming; `note` (e.g. "cancelled") is shown under the message."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.border_subtitle = note or ""
        self.set_class(failed, "-failed")

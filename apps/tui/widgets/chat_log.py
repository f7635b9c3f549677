"""The conversation: a scrolling column of messages that follows new text only while at the bottom."""

from __future__ import annotations

from textual.containers import VerticalScroll

from .message import ChatMessage


class ChatLog(VerticalScroll):
    """Messages oldest first.

    The log is anchored to its end: new text scrolls it while the reader is at the bottom, and
    scrolling up releases the anchor so a reader of older messages is not pulled down (Textual
    re-anchors when the reader scrolls back to the end).
    """

    def on_mount(self) -> None:
        self.anchor()

    async def add_message(self, role: str, text: str = "") -> ChatMessage:
        message = ChatMessage(role, text)
        await self.mount(message)
        return message

    async def show(self, messages: list[tuple[str, str]]) -> None:
        """Replace the log with `messages` (role, text) and go to the end."""
        await self.remove_children()
        if messages:
            await self.mount_all(ChatMessage(role, text) for role, text in messages)
        self.anchor()

    @property
    def messages(self) -> list[ChatMessage]:
        return list(self.query(ChatMessage))

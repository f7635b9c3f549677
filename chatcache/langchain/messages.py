"""LangChain messages to chatcache messages, refusing what a local text-only chat model cannot take.

Accepted: system, human and AI messages (and `ChatMessage` with one of those roles) whose
content is text, either a string or a list of text blocks. Refused with a `ValueError` that
names the type: tool and function messages, AI messages carrying tool calls, and content
blocks that are not text (images, audio, files). Nothing is silently dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
)

from ..model.prompt import Message

_CHAT_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}
_TEXT_BLOCKS = {"text"}


def text_of(message: BaseMessage) -> str:
    """The text of a message's content; a non-text block is a ValueError naming its type."""
    content: Any = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in _TEXT_BLOCKS:
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type", "untyped") if isinstance(block, dict) else type(block).__name__
            raise ValueError(
                f"CachedChatModel takes text only: the {type(message).__name__} has a {kind!r} content block "
                "(images, audio and files are not supported by this model)."
            )
    return "".join(parts)


def role_of(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            raise ValueError("CachedChatModel does not support tool calling: an AIMessage with tool_calls cannot be sent.")
        return "assistant"
    if isinstance(message, ChatMessage) and message.role in _CHAT_ROLES:
        return _CHAT_ROLES[message.role]
    raise ValueError(
        f"CachedChatModel cannot take a {type(message).__name__} (type {message.type!r}): only system, human "
        "and AI text messages are supported (no tool calling)."
    )


def to_chatcache(messages: Sequence[BaseMessage]) -> list[Message]:
    """Convert and check a LangChain message list.

    Raises:
        ValueError: an empty list, a message type or content block the model cannot take, or a
            last message that is not a human message.
    """
    if not messages:
        raise ValueError("CachedChatModel got an empty message list: send at least one HumanMessage.")
    converted = [Message(role_of(m), text_of(m)) for m in messages]
    if converted[-1].role != "user":
        raise ValueError(f"The last message must be a HumanMessage, got a {type(messages[-1]).__name__}.")
    if not converted[-1].content.strip():
        raise ValueError("The last HumanMessage is empty: type something to send.")
    return converted

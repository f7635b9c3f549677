"""LangChain messages to chatcache messages, refusing what a local text-only chat model cannot take.

Accepted: system, human, AI and tool messages (and `ChatMessage` with a system, user or
assistant role) whose content is text, either a string or a list of text blocks. An AI
message's tool calls and a tool message's result are written in the tool format of
`chatcache.model.tools` (results as user messages; several in a row as one). Refused with a
`ValueError` that names the type: function messages and content blocks that are not text
(images, audio, files). Nothing is silently dropped.
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
    ToolMessage,
)

from chatcache import Message, ToolCall

_CHAT_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "ai": "assistant"}
_TEXT_BLOCKS = {"text"}
_CALL_BLOCKS = {"tool_use", "tool_call", "function_call"}
_REASONING_BLOCKS = {"thinking", "redacted_thinking", "reasoning"}


def text_of(message: BaseMessage) -> str:
    """The text of a message's content; a non-text block is a ValueError naming its type.

    An AI message's tool-call blocks (Anthropic's `tool_use`, LangChain's `tool_call`) are
    left out: the same calls are its `tool_calls`, which `model_text` writes. So are its
    reasoning blocks (`thinking`), which no provider shows the model again."""
    content: Any = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in _TEXT_BLOCKS:
            parts.append(str(block.get("text", "")))
        elif isinstance(message, AIMessage) and message.tool_calls and isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            continue
        elif isinstance(message, AIMessage) and isinstance(block, dict) and block.get("type") in _REASONING_BLOCKS:
            continue  # an earlier reply's hidden reasoning: providers leave it out of the next prompt too
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
        return "assistant"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage) and message.role in _CHAT_ROLES:
        return _CHAT_ROLES[message.role]
    raise ValueError(
        f"CachedChatModel cannot take a {type(message).__name__} (type {message.type!r}): only system, human, "
        "AI and tool text messages are supported."
    )


def converted(message: BaseMessage) -> Message:
    """The chatcache message for `message`: its text, its tool calls, or its tool result."""
    text = text_of(message)
    if isinstance(message, ToolMessage):
        content = f"Error: {text}" if message.status == "error" and not text.startswith("Error") else text
        return Message("tool", content, tool_call_id=message.tool_call_id)
    if isinstance(message, AIMessage) and message.invalid_tool_calls:
        raise ValueError("An AIMessage with invalid_tool_calls cannot be sent: fix or drop the calls first.")
    calls = tuple(ToolCall(call["name"], dict(call["args"]), call.get("id") or "") for call in message.tool_calls) if isinstance(message, AIMessage) else ()
    return Message(role_of(message), text, tool_calls=calls)


def to_chatcache(messages: Sequence[BaseMessage]) -> list[Message]:
    """Convert and check a LangChain message list.

    Raises:
        ValueError: an empty list, a message type or content block the model cannot take, or a
            last message that is neither a human nor a tool message.
    """
    if not messages:
        raise ValueError("CachedChatModel got an empty message list: send at least one HumanMessage.")
    conversation = [converted(message) for message in messages]
    if conversation[-1].role not in ("user", "tool"):
        raise ValueError(f"The last message must be a HumanMessage or a ToolMessage, got a {type(messages[-1]).__name__}.")
    if not conversation[-1].content.strip():
        raise ValueError("The last HumanMessage is empty: type something to send.")
    return conversation

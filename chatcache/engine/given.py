"""Conversations the caller keeps (`ChatEngine.complete`: LangChain's way, an OpenAI-style
request): checked, given the engine's system prompt when they have none, with tools bound, and
turned into a `Turn` on the conversation before its last message, which is never recorded.

The token tier keys such a conversation by its start (`conversation_key`), so the next call,
which repeats these messages plus a turn, prefills only the new tail.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..answer_cache import bot_fingerprint
from ..config import GenerationConfig
from ..errors import ConfigError, InvalidMessageError
from ..model.loading import load_embedder
from ..model.prompt import Message, PromptRenderer, ReplyIds
from ..model.tools import HERMES, CallSyntax, ToolChoice, written
from ..steering.hcac import Embed, sentence_embed
from ..steering.tool_router import ToolRouter
from ..steering.tool_use import bind_tools, tool_of
from ..tiers.conversations import Conversation, check_storable
from .turn_record import Admit, Turn

ROLES = ("system", "user", "assistant", "tool")  # a tool message brings one call's result back


def conversation_key(messages: Sequence[Message]) -> str:
    """Token-tier key of a conversation the caller keeps: its system message (if any) and first user message."""
    head: list[Message] = []
    for message in messages:
        head.append(message)
        if message.role == "user":
            break
    raw = "\0".join(f"{m.role}:{m.content}" for m in head)
    return "lc:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


class GivenConversations:
    """Reads the caller's conversations for the engine's model and bot."""

    def __init__(self, renderer: PromptRenderer, system_prompt: str | None, reply_ids: ReplyIds, embed: Embed | None) -> None:
        self.renderer = renderer
        self.system_prompt = system_prompt
        self._reply_ids = reply_ids
        self._embed = embed
        self._tool_embed: Embed | None = None  # the tool router's, loaded on the first call with tools
        self._lock = threading.Lock()

    @property
    def call_syntax(self) -> CallSyntax:
        """How this model writes tool calls: its chat template's way, else Hermes' (`model/tools.py`)."""
        return self.renderer.tool_syntax or HERMES

    def turn(
        self,
        messages: Sequence[Message],
        kv_key: str | None,
        params: GenerationConfig,
        admit: Admit | None,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoice,
        parallel_tool_calls: bool,
        tool_route_threshold: float | None,
    ) -> Turn:
        """The turn that answers the last message, on the conversation before it (`ChatEngine.complete`).

        Raises:
            InvalidMessageError: what `checked` refuses.
            ConfigError: a malformed tool, a choice that names no bound tool, or tools with a reply format.
        """
        renderer, told = self.renderer, ""
        if tools:
            if params.reply_format is not None:
                raise ConfigError("Bind tools or a reply format, not both: a reply is either a call or the formatted answer.")
            route = self._tool_router(tool_route_threshold).called if tool_route_threshold is not None else None
            try:
                bound = bind_tools(
                    self.checked(messages), tools, tool_choice, parallel_tool_calls, params.max_new_tokens, self.renderer, self.system_prompt, route
                )
            except ValueError as error:
                raise ConfigError(str(error)) from None
            messages, renderer, told = bound.messages, bound.renderer, bound.told
            params = replace(params, reply_format=bound.reply_format)
        conversation, question = self.split(messages, kv_key)
        system = conversation.system
        told = (system.content if system else "") + told  # tools are part of what the model was told, as the system message is
        return Turn(
            conversation.id, params, time.perf_counter(), question, given=conversation,
            prefix=renderer.system_ids(system.content) if system else [],
            bot=bot_fingerprint(told or None), admit=admit, renderer=renderer,
        )  # fmt: skip

    def exact_keys(
        self,
        messages: Sequence[Message],
        reply_format: str,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: ToolChoice,
        parallel_tool_calls: bool,
        max_new_tokens: int,
    ) -> tuple[Conversation, str, str | None, list[str]]:
        """What the answer cache keys an exact repeat of this request by, whichever choice the
        tool router would make: the conversation, the question, the bot and the reply formats.

        Raises:
            InvalidMessageError, ValueError: the request itself is wrong (its turn will say how).
        """
        given, question = self.split(messages)
        told = given.system.content if given.system else ""
        formats = [reply_format]
        if tools:  # whichever choice the router would make: each has its format
            choices = [tool_choice, *([tool_of(spec).name for spec in tools] if tool_choice == "auto" else [])]
            laid_out = self.checked(messages)
            bound = [
                bind_tools(laid_out, tools, choice, parallel_tool_calls, max_new_tokens, self.renderer, self.system_prompt, None)
                for choice in choices
            ]
            given, question = self.split(bound[0].messages)
            told = (given.system.content if given.system else "") + bound[0].told
            formats = [b.reply_format.key if b.reply_format else "" for b in bound]
        return given, question.content, bot_fingerprint(told or None), formats

    def split(self, messages: Sequence[Message], kv_key: str | None = None) -> tuple[Conversation, Message]:
        """The caller's conversation before its last (user) message, keyed `kv_key` (default: by
        its start, `conversation_key`), and that message."""
        given = self.checked(messages)
        system = given[0] if given[0].role == "system" else None
        conversation = Conversation(kv_key or conversation_key(given), system, turns=given[1 if system else 0 : -1])
        return conversation, given[-1]

    def checked(self, messages: Sequence[Message]) -> list[Message]:
        """The caller's conversation, checked, with the engine's system prompt first if it has none,
        tool calls and results written as the model reads them (`tools.written`), and our own
        earlier replies in it carrying the ids they were generated as.

        Raises:
            InvalidMessageError: no messages, an unknown role, text no database can store, or a
                last message that is not the user's (or a tool's result) or is empty.
        """
        if not messages:
            raise InvalidMessageError("No messages: send at least one user message.")
        for message in messages:
            if message.role not in ROLES:
                raise InvalidMessageError(f"Unknown role {message.role!r}: use one of {', '.join(ROLES)}.")
            if message.tool_calls and message.role != "assistant":
                raise InvalidMessageError(f"Only assistant messages make tool calls, not a {message.role} message.")
            check_storable(message.content, f"A {message.role} message")  # the tokenizer and the answer cache would fail on it later
        if messages[-1].role not in ("user", "tool"):
            raise InvalidMessageError(f"The last message must be the user's or a tool's result, not the {messages[-1].role}'s.")
        if not messages[-1].content.strip():
            raise InvalidMessageError("The message is empty: type something to send.")
        given = [self._reply_ids.attach(m) for m in written(messages, self.call_syntax)]
        if given[0].role != "system" and self.system_prompt:
            given.insert(0, Message("system", self.system_prompt))
        return given

    def _tool_router(self, threshold: float) -> ToolRouter:
        """A router on the engine's embedder (the bundled one for an engine that loaded none)."""
        with self._lock:
            if self._tool_embed is None:
                self._tool_embed = self._embed or sentence_embed(load_embedder("bundled"))
        return ToolRouter(self._tool_embed, threshold)

"""Tools bound to a turn: where the model reads them, and the format its reply is held to.

One place for what binding tools changes in a turn, so that LangChain's `bind_tools` and the
server's OpenAI `tools` behave alike:
  * the model is told of the tools by its chat template where that has a tool format
    (`PromptRenderer.tool_syntax`), and its calls are held to that format; else by
    `tools_prompt` closing the system message, calls in Hermes' format;
  * with `tool_choice="auto"`, a question the router finds about a tool is answered by a call
    of it (the bundled model never starts a call on its own, `tool_router.py`); a tool result
    coming back is left to the model, which answers it or calls again;
  * the reply is held to `call_format`, each tool's free strings bounded so that a call closes
    within the reply's token budget (`within_budget`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.prompt import Message, PromptRenderer
from ..reply_format import ReplyFormat, within_budget
from ..model.tools import HERMES, CallSyntax, Tool, ToolCall, ToolChoice, call_format, calls_text, is_result, tools_prompt

Route = Callable[[str, Sequence[Tool]], list[Tool]]
"""The tools a question is about, closest first (`ToolRouter.called`)."""


@dataclass(frozen=True)
class BoundTools:
    """A turn's conversation and settings once its tools are bound.

    Attributes:
        messages: the conversation, its system message ending with the tools where the
            template does not lay them out.
        renderer: the renderer to lay the conversation out with (one that renders the tools
            where the template has Hermes' format).
        reply_format: what the reply is held to; None where it is free text (`none`).
        told: the tools as part of what the model was told, for the answer cache's bot
            fingerprint: an answer (or call) made with other tools bound is never served.
        may_call: whether the reply may be a call, so a caller reads it for calls.
    """

    messages: list[Message]
    renderer: PromptRenderer
    reply_format: ReplyFormat | None
    told: str
    may_call: bool


def tool_of(spec: Mapping[str, Any]) -> Tool:
    """A tool from its OpenAI function spec (`{"type": "function", "function": {...}}`).

    Raises:
        ValueError: a spec without a function name, or whose parameters are not a JSON object schema.
    """
    function = spec.get("function") if spec.get("type", "function") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"A tool must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}; got {dict(spec)!r}")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise ValueError(f"The parameters of tool {function['name']!r} must be a JSON schema object")
    return Tool(function["name"], str(function.get("description") or ""), parameters)


def check_tools(specs: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool) -> None:
    """Refuse tools no turn could bind, before one starts: a server answers a malformed spec or a
    choice that names no bound tool with a 400 at validation, not once the turn is under way.

    Raises:
        ValueError: a malformed tool spec, no tools, or a choice that names no bound tool.
    """
    call_format([tool_of(spec) for spec in specs], choice, parallel)


def bind_tools(
    messages: Sequence[Message],
    specs: Sequence[Mapping[str, Any]],
    choice: ToolChoice,
    parallel: bool,
    max_new_tokens: int,
    renderer: PromptRenderer,
    system_prompt: str | None,
    route: Route | None,
) -> BoundTools:
    """Bind `specs` (OpenAI function specs) to a turn on `messages`.

    Args:
        choice: "auto", "any" (a call), "none" (text) or a tool's name (a call of it).
        parallel: whether one reply may make several calls.
        system_prompt: the system message a conversation without one is given.
        route: the router, for `auto`; None leaves the choice to the model.

    Raises:
        ValueError: a malformed tool spec, or a choice that names no bound tool.
    """
    tools = [tool_of(spec) for spec in specs]
    if route is not None and choice == "auto" and not is_result(messages[-1]):
        called = route(messages[-1].content, tools)
        choice = called[0].name if called else choice
    syntax = renderer.tool_syntax or HERMES
    budgeted = [
        Tool(tool.name, tool.description, within_budget(tool.parameters, max_new_tokens, _wrapper_tokens(renderer, tool, syntax)))
        for tool in tools
    ]
    reply_format = call_format(budgeted, choice, parallel, syntax)
    told = json.dumps([tool.spec() for tool in tools], sort_keys=True)
    if renderer.tool_syntax is not None:  # the template tells the model of the tools in its own words
        return BoundTools(list(messages), renderer.with_tools([tool.spec() for tool in tools]), reply_format, told, choice != "none")
    if messages[0].role == "system":
        system, rest = messages[0].content, list(messages[1:])
    else:
        system, rest = system_prompt or "", list(messages)
    described = [Message("system", f"{system}\n\n{tools_prompt(tools)}".strip()), *rest]
    return BoundTools(described, renderer, reply_format, told, choice != "none")


def _wrapper_tokens(renderer: PromptRenderer, tool: Tool, syntax: CallSyntax) -> int:
    """The tokens a call of `tool` takes besides its arguments' values."""
    return len(renderer.encode_text(calls_text([ToolCall(tool.name, {})], syntax)))

"""Tool calling in text: how tools, calls and results are written for the model, and read back.

Most small chat templates (the bundled SmolLM2's among them) have no tool format, so one format
is used for every model, the one SmolLM2's model card and Qwen/Hermes templates use:

  * the tools, as OpenAI function specs in JSON, close the system message between `<tools>`
    and `</tools>`, with how to call them;
  * a reply that calls tools is `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`
    and nothing else;
  * a tool's result comes back as a user message `<tool_response>{"name": ..., "content": ...}</tool_response>`.

The model cannot write a malformed call: `call_format` is the Lark grammar (for `ReplyFormat`)
that lets a reply be free text or a call (`auto`), only a call (`any`), a call of one named
tool, or text only (`none`), with each call's arguments held to that tool's JSON schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .reply_format import JSON_LAYOUT, ReplyFormat

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ToolChoice = Literal["auto", "any", "none"] | str  # or the name of the one tool to call


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def spec(self) -> dict[str, Any]:
        """The OpenAI function spec the model is shown."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def tools_prompt(tools: Sequence[Tool]) -> str:
    """What the system message ends with when tools are bound."""
    specs = json.dumps([tool.spec() for tool in tools], ensure_ascii=False)
    return (
        "You have access to the following tools:\n"
        f"<tools>{specs}</tools>\n"
        "To call tools, reply with only a list of calls in this format:\n"
        f'{CALL_OPEN}[{{"name": "tool name", "arguments": {{"argument": "value"}}}}]{CALL_CLOSE}\n'
        "A tool's result comes back in <tool_response></tool_response>. If no tool is needed, answer in plain text."
    )


def calls_text(calls: Sequence[ToolCall]) -> str:
    """An assistant message that made `calls`, as the model writes it."""
    body = json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False, separators=(", ", ": "))
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def result_text(name: str | None, content: str) -> str:
    """A tool's result, as the user message the model reads it in."""
    body = json.dumps({"name": name, "content": content} if name else {"content": content}, ensure_ascii=False)
    return f"<tool_response>{body}</tool_response>"


def call_format(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> ReplyFormat | None:
    """The reply format for `choice` among `tools`; None where the reply is free text (`none`).

    Args:
        tools: the bound tools.
        choice: "auto" (text or calls), "any" (calls), "none" (text) or a tool's name (a call of it).
        parallel: whether a reply may make several calls (one otherwise: a small model asked for
            one call tends to repeat it).

    Raises:
        ValueError: no tools, or a named tool that is not bound.
    """
    if not tools:
        raise ValueError("tool_choice needs at least one bound tool")
    if choice == "none":
        return None
    chosen = list(tools)
    if choice not in ("auto", "any"):
        chosen = [tool for tool in tools if tool.name == choice]
        if not chosen:
            raise ValueError(f"tool_choice names {choice!r}, which is not among the bound tools: {', '.join(t.name for t in tools)}")
    one_call = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in chosen
    ]
    calls: dict[str, Any] = {"type": "array", "items": {"anyOf": one_call}, "minItems": 1, "x-guidance": JSON_LAYOUT}
    if not parallel:
        calls["maxItems"] = 1
    rules = [f"calls: {json.dumps(CALL_OPEN)} %json {json.dumps(calls)} {json.dumps(CALL_CLOSE)}"]
    if choice == "auto":
        # Free text may not start with "<", so a reply that starts a call must finish it well-formed.
        rules = ["start: TEXT | calls", *rules, "TEXT: /[^<](?s:.*)/"]
    else:
        rules = ["start: calls", *rules]
    return ReplyFormat.lark("\n".join(rules) + "\n")


def parse_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The text before a reply's calls, and the calls (none for a plain-text reply).

    Raises:
        ValueError: a reply that opens a call and does not hold a well-formed list of calls (a
            reply cut short by its token budget).
    """
    head, opened, rest = text.partition(CALL_OPEN)
    if not opened and text.strip() and CALL_OPEN.startswith(text.strip()):
        raise ValueError(f"The model's tool call is cut short: {text!r}")
    if not opened:
        return text, []
    body, closed, _ = rest.partition(CALL_CLOSE)
    try:
        if not closed:
            raise ValueError("no closing tag")
        items = json.loads(body)
        calls = [ToolCall(str(item["name"]), dict(item["arguments"])) for item in items]
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"The model's tool call is cut short or malformed ({error}): {text!r}") from None
    return head, calls

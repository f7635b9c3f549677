"""Tool calling in text: how tools, calls and results are written for the model, and read back.

A chat template that renders tools and calls has its own way of writing a call
(`PromptRenderer.tool_syntax` reads it off the template): Hermes' in Qwen 2.5 and 3
(`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`), a bare
`{"name": ..., "parameters": {...}}` in Llama 3.1 and 3.2. The model then reads the tools,
its earlier calls and their results as its template lays them out, and writes calls as it
learned to. Most small templates (the bundled SmolLM2's among them) have no tool format; for
them the documented format is Hermes' (`HERMES`):

  * the tools, as OpenAI function specs in JSON, one a line, close the system message between
    `<tools>` and `</tools>`, with how to call them (`tools_prompt`);
  * a reply that calls a tool is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    one block per call, and nothing else;
  * a tool's result comes back in a user message as `<tool_response>\n...\n</tool_response>`,
    the results of one reply's calls in one message.

Callers hand the engine structured messages (an assistant message's `tool_calls`, one `tool`
message per result); `written` lays them out in the model's syntax.

The model cannot write a malformed call: `call_format` is the Lark grammar (for `ReplyFormat`)
that lets a reply be free text or a call (`auto`), only a call (`any`), a call of one named
tool, or text only (`none`), with each call's arguments held to that tool's JSON schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .prompt import Message
from .reply_format import JSON_LAYOUT, ReplyFormat

ToolChoice = Literal["auto", "any", "none"] | str  # or the name of the one tool to call
CHOICE_NAMES: dict[str | bool | None, ToolChoice] = {None: "auto", "auto": "auto", "none": "none", "any": "any", "required": "any", True: "any"}
"""The choices as LangChain and OpenAI name them ("required" and True: a call of any tool)."""


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


@dataclass(frozen=True)
class CallSyntax:
    """How a model writes its calls: each is `open`, the JSON object `{"name": ...,
    arguments_key: {...}}` as `json.dumps` lays it out, then `close`.

    Attributes:
        between: what separates two calls of one reply; None where a reply makes one call.
        tool_role: whether results go to the template as `tool` messages, one per result;
            else the results of one reply's calls are one user message of `<tool_response>` blocks.
    """

    open: str
    close: str
    arguments_key: str = "arguments"
    between: str | None = "\n"
    tool_role: bool = False

    @property
    def first(self) -> str:
        """The character a call starts with (free text may not start with it under `auto`)."""
        return (self.open or "{")[0]


HERMES = CallSyntax("<tool_call>\n", "\n</tool_call>")


def tools_prompt(tools: Sequence[Tool]) -> str:
    """What the system message ends with when tools are bound."""
    specs = "\n".join(json.dumps(tool.spec(), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{HERMES.open.strip()}{HERMES.close.strip()} XML tags:\n"
        f'{HERMES.open}{{"name": <function-name>, "arguments": <args-json-object>}}{HERMES.close}\n\n'
        "If no function is needed, answer in plain text."
    )


def calls_text(calls: Sequence[ToolCall], syntax: CallSyntax = HERMES) -> str:
    """An assistant message that made `calls`, as the model writes it."""
    written = [
        syntax.open + json.dumps({"name": c.name, syntax.arguments_key: c.arguments}, ensure_ascii=False) + syntax.close for c in calls
    ]
    return (syntax.between or "").join(written)


RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"


def result_text(content: str) -> str:
    """A tool's result, as the user message the model reads it in."""
    return f"{RESULT_OPEN}\n{content}\n{RESULT_CLOSE}"


def is_result(message: Message) -> bool:
    """Whether a message brings tool results back (rather than asking something)."""
    return message.role == "tool" or (message.role == "user" and message.content.startswith(RESULT_OPEN))


def written(messages: Sequence[Message], syntax: CallSyntax) -> list[Message]:
    """`messages` as the model reads them: each assistant message's calls written after its
    text, and the results as `syntax` takes them (`tool` messages, or one user message for
    the results of one reply's calls)."""
    laid_out: list[Message] = []
    for message in messages:
        if message.tool_calls:
            laid_out.append(Message("assistant", message.content + calls_text(message.tool_calls, syntax)))
        elif message.role == "tool" and not syntax.tool_role:
            if laid_out and laid_out[-1].role == "user" and is_result(laid_out[-1]):  # another result of the same reply
                laid_out[-1] = Message("user", f"{laid_out[-1].content}\n{result_text(message.content)}")
            else:
                laid_out.append(Message("user", result_text(message.content)))
        else:
            laid_out.append(message)
    return laid_out


def call_format(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, syntax: CallSyntax = HERMES) -> ReplyFormat | None:
    """The reply format for `choice` among `tools`, calls written in `syntax`; None where the
    reply is free text (`none`).

    Args:
        tools: the bound tools.
        choice: "auto" (text or calls), "any" (calls), "none" (text) or a tool's name (a call of it).
        parallel: whether a reply may make several calls (one otherwise: a small model asked for
            one call tends to repeat it); only where `syntax` has a separator for them.

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
    one_call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, syntax.arguments_key: dict(tool.parameters)},
                "required": ["name", syntax.arguments_key],
                "additionalProperties": False,
            }
            for tool in chosen
        ],
        "x-guidance": JSON_LAYOUT,
    }
    several = parallel and syntax.between is not None
    rules = [
        "calls: call" + (f" ({json.dumps(syntax.between)} call)*" if several else ""),
        "call: " + " ".join([*([json.dumps(syntax.open)] if syntax.open else []), "%json", json.dumps(one_call), *([json.dumps(syntax.close)] if syntax.close else [])]),
    ]
    if choice == "auto":
        # Free text may not start as a call does, so a reply that starts a call must finish it well-formed.
        rules = ["start: TEXT | calls", *rules, f"TEXT: /[^{re.escape(syntax.first)}](?s:.*)/"]
    else:
        rules = ["start: calls", *rules]
    return ReplyFormat.lark("\n".join(rules) + "\n")


def parse_calls(text: str, syntax: CallSyntax = HERMES) -> tuple[str, list[ToolCall]]:
    """The text before a reply's calls, and the calls (none for a plain-text reply).

    Raises:
        ValueError: a reply that opens a call and does not hold well-formed calls (a reply cut
            short by its token budget).
    """
    opening = syntax.open.strip()
    if opening:
        head, opened, _ = text.partition(opening)
        if not opened:
            if text.strip() and opening.startswith(text.strip()):
                raise ValueError(f"The model's tool call is cut short: {text!r}")
            return text, []
        rest = text[len(head):]
    elif text.lstrip().startswith("{"):  # a call is the whole reply: text that only contains a brace is text
        head, rest = "", text.lstrip()
    else:
        return text, []
    calls = []
    decoder = json.JSONDecoder()
    try:
        while rest.strip():
            if not rest.startswith(opening):
                raise ValueError(f"text after a call: {rest.strip()[:40]!r}")
            item, end = decoder.raw_decode(rest, len(rest) - len(rest[len(opening):].lstrip()))
            after = rest[end:].lstrip()
            if not after.startswith(syntax.close.strip()):
                raise ValueError("no closing tag")
            calls.append(ToolCall(str(item["name"]), dict(item[syntax.arguments_key])))
            rest = after[len(syntax.close.strip()):].lstrip()
            if rest and (syntax.between is None or not rest.startswith(syntax.between.strip())):
                raise ValueError(f"text after a call: {rest[:40]!r}")
            rest = rest[len(syntax.between.strip()) :].lstrip() if syntax.between else rest
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"The model's tool call is cut short or malformed ({error}): {text!r}") from None
    return head, calls

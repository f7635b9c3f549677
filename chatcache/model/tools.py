"""Tool calling in text: how tools, calls and results are written for the model, and read back.

Most small chat templates (the bundled SmolLM2's among them) have no tool format, so one format
is used for every model: Hermes', which Qwen 2.5 and 3 templates render natively, so a model
trained on it sees and writes exactly what it learned:

  * the tools, as OpenAI function specs in JSON, one a line, close the system message between
    `<tools>` and `</tools>`, with how to call them;
  * a reply that calls a tool is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    one block per call, and nothing else;
  * a tool's result comes back in a user message as `<tool_response>\n...\n</tool_response>`,
    one block per result.

Templates with a tool format of their own other than Hermes' (Llama 3.1's, Mistral's) are not
used for it: the model reads and writes this one.

The model cannot write a malformed call: `call_format` is the Lark grammar (for `ReplyFormat`)
that lets a reply be free text or a call (`auto`), only a call (`any`), a call of one named
tool, or text only (`none`), with each call's arguments held to that tool's JSON schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .prompt import Message
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
    specs = "\n".join(json.dumps(tool.spec(), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{CALL_OPEN}{CALL_CLOSE} XML tags:\n"
        f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}\n\n'
        "If no function is needed, answer in plain text."
    )


def calls_text(calls: Sequence[ToolCall]) -> str:
    """An assistant message that made `calls`, as the model writes it."""
    return "\n".join(
        f"{CALL_OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}" for c in calls
    )


RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"


def result_text(content: str) -> str:
    """A tool's result, as the user message the model reads it in."""
    return f"{RESULT_OPEN}\n{content}\n{RESULT_CLOSE}"


def results_message(results: Sequence[str]) -> Message:
    """The results of one reply's calls, in order, as the one user message the model reads them in."""
    return Message("user", "\n".join(result_text(result) for result in results))


def is_result(text: str) -> bool:
    """Whether a user message brings tool results back (rather than asking something)."""
    return text.startswith(RESULT_OPEN)


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
    one_call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in chosen
        ],
        "x-guidance": JSON_LAYOUT,
    }
    rules = [
        "calls: call" + (' ("\\n" call)*' if parallel else ""),
        f"call: {json.dumps(CALL_OPEN + chr(10))} %json {json.dumps(one_call)} {json.dumps(chr(10) + CALL_CLOSE)}",
    ]
    if choice == "auto":
        # Free text may not start with "<", so a reply that starts a call must finish it well-formed.
        rules = ["start: TEXT | calls", *rules, "TEXT: /[^<](?s:.*)/"]
    else:
        rules = ["start: calls", *rules]
    return ReplyFormat.lark("\n".join(rules) + "\n")


def parse_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The text before a reply's calls, and the calls (none for a plain-text reply).

    Raises:
        ValueError: a reply that opens a call and does not hold well-formed calls (a reply cut
            short by its token budget).
    """
    head, opened, rest = text.partition(CALL_OPEN)
    if not opened and text.strip() and CALL_OPEN.startswith(text.strip()):
        raise ValueError(f"The model's tool call is cut short: {text!r}")
    if not opened:
        return text, []
    calls = []
    try:
        for block in (CALL_OPEN + rest).split(CALL_OPEN)[1:]:
            body, closed, tail = block.partition(CALL_CLOSE)
            if not closed or tail.strip():
                raise ValueError("no closing tag" if not closed else f"text after a call: {tail.strip()[:40]!r}")
            item = json.loads(body)
            calls.append(ToolCall(str(item["name"]), dict(item["arguments"])))
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"The model's tool call is cut short or malformed ({error}): {text!r}") from None
    return head, calls

"""Tool calling in text: how tools, calls and results are written for the model, and read back.

A chat template that renders tools and calls has its own way of writing a call
(`PromptRenderer.tool_syntax` reads it off the template): Hermes' in Qwen 2.5 and 3
(`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`), a bare
`{"name": ..., "parameters": {...}}` in Llama 3.1 and 3.2, a list of calls with ids in
Mistral's (`[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "a1b2c3d4e"}, ...]`, each
result naming the id it answers). The model then reads the tools,
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

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from .prompt import Message
from ..reply_format import JSON_LAYOUT, ReplyFormat

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
    """A call a reply made; `id` is what its result names it by (empty where nobody gave one)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
CALL_ID_PATTERN = f"^{_CALL_ID.pattern}$"
"""The ids a template that writes ids gets: Mistral's require nine letters and digits."""


def call_id(given: str) -> str:
    """The id a call and its result are written with where the template writes ids: the given
    one when it is nine letters and digits, else nine hex digits derived from it, so that a call
    and the result naming it still agree (OpenAI's and LangChain's ids are longer)."""
    return given if _CALL_ID.fullmatch(given) else hashlib.sha256(given.encode()).hexdigest()[:9]


@dataclass(frozen=True)
class CallSyntax:
    """How a model writes its calls: each is `open`, the JSON object `{"name": ...,
    arguments_key: {...}}` as `json.dumps` lays it out, then `close`.

    Attributes:
        between: what separates two calls of one reply; None where a reply makes one call.
        tool_role: whether results go to the template as `tool` messages, one per result;
            else the results of one reply's calls are one user message of `<tool_response>` blocks.
        id_key: the key a call's id is written under, after its arguments, where the template
            writes ids (its results then name the call by `tool_call_id`).
        joined: one reply's calls share one `open` and `close`, `between` separating them (a
            JSON list after a marker, as Mistral's); else each call has its own.
    """

    open: str
    close: str
    arguments_key: str = "arguments"
    between: str | None = "\n"
    tool_role: bool = False
    id_key: str | None = None
    joined: bool = False

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
    items = []
    for call in calls:
        item: dict[str, Any] = {"name": call.name, syntax.arguments_key: call.arguments}
        if syntax.id_key is not None:
            item[syntax.id_key] = call_id(call.id)
        items.append(json.dumps(item, ensure_ascii=False))
    if syntax.joined:
        return syntax.open + (syntax.between or "").join(items) + syntax.close
    return (syntax.between or "").join(syntax.open + item + syntax.close for item in items)


RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"


def result_text(content: str) -> str:
    """A tool's result, as the user message the model reads it in."""
    return f"{RESULT_OPEN}\n{content}\n{RESULT_CLOSE}"


def is_result(message: Message) -> bool:
    """Whether a message brings tool results back (rather than asking something)."""
    return message.role == "tool" or (message.role == "user" and message.content.startswith(RESULT_OPEN))


def written(messages: Sequence[Message], syntax: CallSyntax = HERMES) -> list[Message]:
    """`messages` as the model reads them: each assistant message's calls written after its
    text, and the results as `syntax` takes them (`tool` messages, or one user message for
    the results of one reply's calls); by default in the documented format, Hermes', as a
    record kept apart from any model stores them (`SessionChatHistory`)."""
    laid_out: list[Message] = []
    for message in messages:
        if message.tool_calls:
            laid_out.append(Message("assistant", message.content + calls_text(message.tool_calls, syntax)))
        elif message.role == "tool" and syntax.tool_role and syntax.id_key is not None:
            laid_out.append(replace(message, tool_call_id=call_id(message.tool_call_id)))
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
    identified = {syntax.id_key: {"type": "string", "pattern": CALL_ID_PATTERN}} if syntax.id_key is not None else {}
    one_call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, syntax.arguments_key: dict(tool.parameters), **identified},
                "required": ["name", syntax.arguments_key, *identified],
                "additionalProperties": False,
            }
            for tool in chosen
        ],
        "x-guidance": JSON_LAYOUT,
    }
    several = parallel and syntax.between is not None
    open_, close = [json.dumps(syntax.open)] if syntax.open else [], [json.dumps(syntax.close)] if syntax.close else []
    item = ["%json", json.dumps(one_call)]
    calls = "call" + (f" ({json.dumps(syntax.between)} call)*" if several else "")
    if syntax.joined:
        rules = ["calls: " + " ".join([*open_, calls, *close]), "call: " + " ".join(item)]
    else:
        rules = ["calls: " + calls, "call: " + " ".join([*open_, *item, *close])]
    if choice == "auto":
        # Free text may not start as a call does, so a reply that starts a call must finish it well-formed.
        rules = ["start: TEXT | calls", *rules, f"TEXT: /[^{re.escape(syntax.first)}](?s:.*)/"]
    else:
        rules = ["start: calls", *rules]
    return ReplyFormat.lark("\n".join(rules) + "\n")


def _call_of(item: Any, syntax: CallSyntax) -> ToolCall:
    """The call a decoded JSON object holds (KeyError, TypeError: not a call in `syntax`)."""
    given = str(item[syntax.id_key]) if syntax.id_key is not None else ""
    return ToolCall(str(item["name"]), dict(item[syntax.arguments_key]), given)


def parse_calls(text: str, syntax: CallSyntax = HERMES) -> tuple[str, list[ToolCall]]:
    """The text before a reply's calls, and the calls (none for a plain-text reply).

    Raises:
        ValueError: a reply that opens a call and does not hold well-formed calls (a reply cut
            short by its token budget inside a call). Calls cut off only in their closing tag
            are whole: their arguments are kept (multibyte text can take more tokens than the
            budget left the strings, `within_budget`).
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
    separator, closing = (syntax.between or "").strip(), syntax.close.strip()
    try:
        if syntax.joined:  # one opening for every call, one closing after the last
            rest = rest[len(opening) :]
        while rest.strip():
            if not syntax.joined:
                if not rest.startswith(opening):
                    raise ValueError(f"text after a call: {rest.strip()[:40]!r}")
                rest = rest[len(opening) :]
            rest = rest.lstrip()
            item, end = decoder.raw_decode(rest)
            calls.append(_call_of(item, syntax))
            after = rest[end:].lstrip()
            if syntax.joined and syntax.between is not None and after.startswith(separator) and separator:
                rest = after[len(separator) :]
                continue
            if not after.startswith(closing):
                if closing.startswith(after.rstrip()):  # the budget ran out in the closing tag: the call is whole
                    return head, calls
                raise ValueError("no closing tag")
            rest = after[len(closing) :].lstrip()
            if syntax.joined:
                if rest:
                    raise ValueError(f"text after the calls: {rest[:40]!r}")
                return head, calls
            if rest and (syntax.between is None or not rest.startswith(separator)):
                raise ValueError(f"text after a call: {rest[:40]!r}")
            rest = rest[len(separator) :].lstrip() if syntax.between else rest
        if syntax.joined and not (closing and calls):  # a list cut after a whole call keeps it; an empty one is cut short
            raise ValueError("no closing tag")
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"The model's tool call is cut short or malformed ({error}): {text!r}") from None
    return head, calls

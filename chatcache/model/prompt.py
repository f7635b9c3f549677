"""Render a conversation into token ids with the model's own chat template, one segment per message.

Why segments: the token tier must see a past reply exactly as the model generated it, not as
its text would re-tokenize. Each message's segment is the text its template adds after the
messages before it; an assistant segment is the generated ids themselves framed by the
template's text around them, opening with its generation prompt. Concatenated, the segments
spell the template's rendering of the whole conversation, with the generation prompt added
when the user spoke last (so two user messages in a row, a tool's result and a question,
render as the template renders them).

Templates that are not prefix-stable (rendering more messages changes earlier text, as some
reasoning templates do) are rendered whole on every turn instead; the token tier still
reuses whatever common prefix survives.

Message content is always plain text (see `plain_text`): only the template's own special
tokens come out as special ids.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from functools import cached_property
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from .plain_text import PlainText

if TYPE_CHECKING:
    from .tools import CallSyntax, ToolCall

_PROBE_ID = "chatcache"  # a probe call's id: nine letters, the length Mistral's templates require
_PLACEHOLDER = "\u2063chatcache-reply\u2063"
TOOL_RENDERERS = 32  # tool sets whose renderers are kept (`PromptRenderer.with_tools`)


@dataclass
class Message:
    """One message of a conversation; an assistant message keeps the ids it was generated as.

    An assistant message may carry the tool calls it made, and a `tool` message one call's
    result (and the id of the call it answers), until the engine writes them in the model's own
    syntax (`tools.written`).
    """

    role: str
    content: str
    generated_ids: tuple[int, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True)
class Prompt:
    """What the model is given for one reply: the conversation's messages as laid out (system
    message, the turns that fit, the new message) and the token ids they render to."""

    ids: list[int]
    messages: list[Message]
    dropped_turns: int = 0  # earlier turns left out (to fit the context window, or past a topic change)


@dataclass
class RenderedSegments:
    """Memo of per-message segment ids, valid while the messages before them stay the same."""

    ids: list[list[int]] = field(default_factory=list)


class PromptRenderer:
    """Token ids for a conversation, as the model's chat template lays it out.

    Args:
        tokenizer: the model's tokenizer, with its chat template.
        tools: OpenAI function specs the template renders (`with_tools`); none by default.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self.tokenizer = tokenizer
        self.tools: list[dict[Any, Any]] = [dict(tool) for tool in tools]
        self.plain_text = PlainText(tokenizer)
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else repr(tokenizer.chat_template)
        self.template_hash = hashlib.sha256(template.encode()).hexdigest()[:16]
        eos = tokenizer.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.incremental = self._is_prefix_stable()
        self._with_tools: OrderedDict[str, PromptRenderer] = OrderedDict()
        self._with_tools_lock = threading.Lock()

    def with_tools(self, tools: Sequence[Mapping[str, Any]]) -> PromptRenderer:
        """A renderer whose template also lays out `tools` (where the template puts them).

        Kept for the last `TOOL_RENDERERS` tool sets: an agent binds the same tools on every
        call, and a new renderer probes its template (several renders) before its first prompt.
        """
        key = json.dumps(list(tools), sort_keys=True)
        with self._with_tools_lock:
            renderer = self._with_tools.get(key)
            if renderer is None:
                renderer = self._with_tools[key] = PromptRenderer(self.tokenizer, tools)
                while len(self._with_tools) > TOOL_RENDERERS:
                    self._with_tools.popitem(last=False)
            self._with_tools.move_to_end(key)
            return renderer

    @cached_property
    def tool_syntax(self) -> CallSyntax | None:
        """How the chat template writes a tool call, where it lays out tools and calls itself
        (Qwen's: Hermes' format; Llama 3.1's: a bare JSON object; Mistral's: a list of calls
        with ids); None where it has no tool format, or one this cannot read back exactly (a
        call not laid out as `json.dumps` does, keys besides the name, arguments and id). Read
        off the template by rendering probe calls."""
        from .tools import CallSyntax

        def reply(calls: int, then: Sequence[dict[str, Any]] = ()) -> str:
            """What the template writes after its generation prompt for a reply making `calls` probe calls."""
            call = {"type": "function", "id": _PROBE_ID, "function": {"name": "chatcache_probe", "arguments": {"a": 1}}}
            asked: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
            made = [*asked, {"role": "assistant", "content": "", "tool_calls": [call] * calls}, *then]
            before = self._render_dicts(asked, tools, add_generation_prompt=True)
            after = self._render_dicts(made, tools)
            if "chatcache_probe" not in before or not after.startswith(before):
                raise ValueError("the tools are not laid out, or the reply does not extend the prompt")
            return after[len(before) :]

        tools: list[dict[Any, Any]] = [{"type": "function", "function": {"name": "chatcache_probe", "description": "", "parameters": {"type": "object"}}}]
        try:
            one = reply(1)
            start = one.index("{")
            item, end = json.JSONDecoder().raw_decode(one, start)
            arguments = [key for key, value in item.items() if value == {"a": 1}]
            ids = [key for key, value in item.items() if value == _PROBE_ID]
            if item.get("name") != "chatcache_probe" or len(arguments) != 1 or list(item) != ["name", *arguments, *ids] or one[start:end] != json.dumps(item):
                return None
            asked_and_replied = [Message("user", "x"), Message("assistant", _PLACEHOLDER)]  # a reply alone may break the template's role order
            foot = self._render(asked_and_replied).partition(_PLACEHOLDER)[2]
            close = one[end:].removesuffix(foot) if foot.strip() else one[end:].rstrip()
            syntax = CallSyntax(one[:start], close, arguments[0], between=None, id_key=ids[0] if ids else None)
        except Exception:  # noqa: BLE001 - a template that cannot render the probe has no tool format we can use
            return None
        try:  # two calls in one reply: what goes between them, if the template allows it
            two = reply(2)
            if two.startswith(one[: end + len(close)]):  # each call opened and closed on its own
                rest = two[end + len(close) :]
                between = rest[: rest.index(syntax.open + "{")] if syntax.open else rest[: rest.index("{")]
                syntax = replace(syntax, between=between)
            elif two.startswith(one[:end]):  # the calls share one opening and closing (a list)
                rest = two[end:]
                syntax = replace(syntax, between=rest[: rest.index("{")], joined=True)
        except Exception:  # noqa: BLE001 - Llama 3.1's template refuses a second call
            pass
        try:  # results: one `tool` message each, where the template renders them one after another
            result = {"role": "tool", "content": "r", "tool_call_id": _PROBE_ID}
            if reply(1, [result, result]).startswith(reply(1, [result])):
                syntax = replace(syntax, tool_role=True)
        except Exception:  # noqa: BLE001 - results then go in a user message
            pass
        return syntax

    def _render_dicts(self, messages: list[dict[str, Any]], tools: list[dict[Any, Any]], add_generation_prompt: bool = False) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tools=list(tools), tokenize=False, add_generation_prompt=add_generation_prompt))

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        if not messages and not add_generation_prompt:
            return ""
        text = self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": self.plain_text.mark(m.content), **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})} for m in messages],
            tools=list(self.tools) or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        return str(text)

    def _encode(self, text: str) -> list[int]:
        return self.plain_text.encode_rendered(text)

    def encode_text(self, text: str) -> list[int]:
        """Ids of a message's text on its own, as plain text (for counting its tokens)."""
        return self.plain_text.encode(text)

    def _is_prefix_stable(self) -> bool:
        """Whether each message only appends text, which segment-wise rendering relies on."""
        probe = [
            Message("system", "s"),
            Message("user", "u1"),
            Message("assistant", "a1"),
            Message("user", "u2"),
            Message("assistant", "a2"),
        ]
        try:
            for end in range(1, len(probe) + 1):
                last = probe[end - 1]
                before = self._render(probe[: end - 1], add_generation_prompt=last.role == "assistant")
                after = self._render(probe[:end], add_generation_prompt=last.role == "user")
                if not after.startswith(before):
                    return False
            return True
        except Exception:  # noqa: BLE001 - a template that cannot render the probe is not incremental
            return False

    def system_ids(self, system_prompt: str) -> list[int]:
        """The shared prefix: what the system message alone renders to."""
        return self.segment([], Message("system", system_prompt))

    def segment(self, history: Sequence[Message], message: Message) -> list[int]:
        """Ids that `message` adds after `history`; an assistant segment starts with the
        template's opening of a reply (its generation prompt)."""
        if message.role == "assistant":
            before = self._render(history)
            after = self._render([*history, Message("assistant", _PLACEHOLDER)])
            head, _, foot = after[len(before):].partition(_PLACEHOLDER)
            generated = list(message.generated_ids or self.plain_text.encode(message.content))
            if generated and generated[-1] in self._eos_ids and self._encode(foot)[:1] == generated[-1:]:
                generated = generated[:-1]  # the template's footer closes the turn with that same token
            return self._encode(head) + generated + self._encode(foot)
        before = self._render(history)
        after = self._render([*history, message])
        return self._encode(after[len(before):])

    def conversation_ids(self, messages: Sequence[Message], memo: RenderedSegments) -> list[int]:
        """Ids of the whole conversation, ending with the generation prompt when the last message is the user's.

        Args:
            messages: the conversation, system message first if there is one.
            memo: segments computed on earlier turns; extended in place.
        """
        last_is_user = bool(messages) and messages[-1].role in ("user", "tool")
        if not self.incremental:
            return self._encode(self._render(messages, add_generation_prompt=last_is_user))
        del memo.ids[len(messages):]
        for index in range(len(memo.ids), len(messages)):
            memo.ids.append(self.segment(messages[:index], messages[index]))
        ids = [token for segment in memo.ids for token in segment]
        if last_is_user:  # not memoized: the reply's segment opens with it (read off the last message alone)
            last = messages[-1:]
            ids += self._encode(self._render(last, add_generation_prompt=True)[len(self._render(last)):])
        return ids


class ReplyIds:
    """The token ids of recent replies, by their text (bounded, least recently used out).

    A caller that keeps the conversation itself (LangChain, an OpenAI-style request) sends our
    replies back as text; attached here, each renders to the ids its KV was computed for, not
    to a re-tokenisation of its text that might differ.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, text: str, ids: Sequence[int]) -> None:
        with self._lock:
            self._ids[text] = tuple(ids)
            self._ids.move_to_end(text)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)

    def attach(self, message: Message) -> Message:
        """`message` with the ids it was generated as, when it is one of our replies."""
        if message.role != "assistant" or message.generated_ids is not None:
            return message
        with self._lock:
            ids = self._ids.get(message.content)
        return Message("assistant", message.content, ids) if ids is not None else message

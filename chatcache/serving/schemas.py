"""The HTTP API's request and response bodies: OpenAI's chat completions as clients send them,
and the sessions API. Pydantic checks every request before anything runs (400 with the field)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chatcache import CHOICE_NAMES, CallSyntax, Message, ToolCall, ToolChoice, check_tools, parse_calls

from ..answer_cache import BoundStatus
from ..reply_format import ReplyFormat, from_response_format
from ..reply import Reply

FINISH_REASONS = {"eos": "stop", "stop": "stop", "cache": "stop", "flow": "stop", "action": "stop", "handed_off": "stop", "length": "length", "cancelled": "stop"}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallItem(BaseModel):
    """A call an earlier assistant message made, as the client sends it back."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    def call(self) -> ToolCall:
        try:
            arguments = json.loads(self.function.arguments or "{}")
        except json.JSONDecodeError as error:
            raise ValueError(f"the arguments of call {self.id!r} are not JSON: {error}") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"the arguments of call {self.id!r} must be a JSON object")
        return ToolCall(self.function.name, arguments, self.id)


class ChatMessage(BaseModel):
    """One message; `developer` is OpenAI's newer name for the system role. An assistant message
    may carry the tool calls it made, and a `tool` message brings one call's result back."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.tool_calls:
            for item in self.tool_calls:
                item.call()  # arguments that are not a JSON object are a 400 now
        return self

    @property
    def text(self) -> str:
        content = self.content or ""
        return content if isinstance(content, str) else "".join(part.text for part in content)

    def message(self) -> Message:
        """The engine's message: its calls and results kept as such (the engine writes them in the model's format)."""
        calls = tuple(item.call() for item in self.tool_calls or [])
        return Message("system" if self.role == "developer" else self.role, self.text, tool_calls=calls, tool_call_id=self.tool_call_id or "")


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema a reply is held to."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "reply"
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON held to a schema (the
    decoder lets through only tokens that keep the reply in it)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def reply_format(self) -> ReplyFormat | None:
        """The engine's reply format; a `ValueError` (a 400) for a schema it cannot hold a reply to."""
        return from_response_format(self.model_dump(by_alias=True, exclude_none=True))


class Generation(BaseModel):
    """The decoding settings a turn may set."""

    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None

    @field_validator("response_format")
    @classmethod
    def _holdable(cls, response_format: ResponseFormat | None) -> ResponseFormat | None:
        if response_format is not None:
            response_format.reply_format()  # a schema the decoder cannot hold a reply to is a 400 now
        return response_format

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    def reply_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def options(self, default_max_tokens: int) -> dict[str, Any]:
        """The engine's keyword arguments for these settings."""
        return {
            "max_new_tokens": self.reply_tokens(default_max_tokens),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
            "reply_format": self.response_format.reply_format() if self.response_format else None,
        }


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    """A tool the model may call: OpenAI's function tool."""

    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(Generation):
    """`POST /v1/chat/completions`; fields this server does not use (`logprobs`, ...) are ignored.

    `parallel_tool_calls` is false unless asked for (OpenAI's default is true): a small model
    allowed several calls tends to repeat the one it made.
    """

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(1, ge=1, le=1)
    user: str | None = Field(None, max_length=256)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = False

    @model_validator(mode="after")
    def _results_answer_calls(self) -> ChatCompletionRequest:
        called: set[str] = set()  # the calls of the last assistant message, by id
        for message in self.messages:
            if message.role == "tool" and message.tool_call_id not in called:
                raise ValueError(
                    "a message with role 'tool' must answer a call of the assistant message before it: "
                    f"its tool_call_id {message.tool_call_id!r} names none of that message's tool_calls"
                )
            if message.role != "tool":
                called = {item.id for item in message.tool_calls or []}
        return self

    @model_validator(mode="after")
    def _tools_hold(self) -> ChatCompletionRequest:
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice needs tools")
        if self.tools and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("send tools or a response_format, not both: a reply is either a call or the formatted answer")
        if self.tools:  # a choice that names no tool, or a schema no call can be held to, is a 400 now
            check_tools(self.tool_specs(), self.choice(), self.parallel_tool_calls)
        return self

    def tool_specs(self) -> list[dict[str, Any]]:
        return [tool.model_dump(exclude_none=True) for tool in self.tools or []]

    def choice(self) -> ToolChoice:
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return CHOICE_NAMES[self.tool_choice]

    @property
    def may_call(self) -> bool:
        """Whether the reply may be tool calls."""
        return bool(self.tools) and self.choice() != "none"

    def tool_options(self) -> dict[str, Any]:
        """The engine's keyword arguments for the bound tools (none without them)."""
        if not self.tools:
            return {}
        return {"tools": self.tool_specs(), "tool_choice": self.choice(), "parallel_tool_calls": self.parallel_tool_calls}


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, min_length=1, max_length=90)
    title: str | None = Field(None, max_length=200)


class SessionMessage(Generation):
    """`POST /v1/sessions/{id}/messages`: the user's new message and its decoding settings."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1)


class SessionRename(BaseModel):
    """`PATCH /v1/sessions/{id}`: a new title, or null to go back to none."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(max_length=200)


class AgentClaim(BaseModel):
    """`POST /v1/sessions/{id}/claim` and `/hand-back`: the person taking over or giving back a
    session. An agent's key names them, so `agent` is only read on an open server (no keys)."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = Field(None, min_length=1, max_length=64)  # the `String(64)` of the session's `claimed_by`


class AgentMessage(AgentClaim):
    """`POST /v1/sessions/{id}/agent`: a person's reply in a session handed off to them."""

    content: str = Field(min_length=1)


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(reply: Reply) -> dict[str, Any]:
    stats = reply.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
    }


def served(reply: Reply, session_id: str | None, predicted_ttft_s: float | None, bound: BoundStatus | None) -> dict[str, Any]:
    """The `chatcache` extension field: where the answer came from and the turn's figures, and,
    when the answer cache holds an error bound, the bound and what its audits measured."""
    stats = reply.stats
    return {
        "session_id": session_id,
        "tier": stats.tier,
        "finish_reason": stats.finish_reason,
        "answer_cache_hit": stats.answer_cache_hit,
        "drift": stats.drift,
        "drift_undone": stats.drift_undone,
        "intent": reply.intent,
        "dialogue_state": reply.dialogue_state,
        "handed_off": reply.handed_off,
        "action": reply.action.as_dict() if reply.action is not None else None,
        "ttft_s": round(stats.ttft_s, 4),
        "predicted_ttft_s": None if predicted_ttft_s is None else round(predicted_ttft_s, 4),
        "reused_tokens": stats.reused_tokens,
        "prefilled_tokens": stats.prefilled_tokens,
        "generated_tokens": stats.generated_tokens,
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "dropped_turns": stats.dropped_turns,
        **({"answer_cache_bound": answer_cache_bound(bound)} if bound is not None else {}),
    }


def answer_cache_bound(bound: BoundStatus) -> dict[str, Any]:
    """The bound as a reply carries it: the error rate served answers may have, and the audits'."""
    return {
        "max_error_rate": bound.max_error_rate,
        "confidence": bound.confidence,
        "audits": bound.audits,
        "audit_errors": bound.audit_errors,
        "estimate": None if bound.estimate is None else round(bound.estimate, 4),
        "interval": [round(bound.interval[0], 4), round(bound.interval[1], 4)],
    }


def reply_message(reply: Reply, calls_in: CallSyntax | None) -> tuple[dict[str, Any], str]:
    """The assistant message of a reply and its finish reason: its calls, where it may make
    them (written in `calls_in`) and made any."""
    reason = FINISH_REASONS.get(reply.stats.finish_reason, "stop")
    if calls_in is not None:
        try:
            head, calls = parse_calls(reply.text, calls_in)
        except ValueError:  # a call cut short by the token budget: the text, and why it ended
            return {"role": "assistant", "content": reply.text}, reason
        if calls:
            return {"role": "assistant", "content": head or None, "tool_calls": tool_calls(calls)}, "tool_calls"
    return {"role": "assistant", "content": reply.text}, reason


def tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls as OpenAI returns them, each with its id (the model's own where its format writes
    one, else a new one) and its arguments as JSON text."""
    return [
        {"id": c.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for c in calls
    ]


def completion(cid: str, model: str, reply: Reply, extension: dict[str, Any], calls_in: CallSyntax | None = None) -> dict[str, Any]:
    message, reason = reply_message(reply, calls_in)
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": usage(reply),
        "chatcache": extension,
    }


def chunk(cid: str, model: str, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        **extra,
    }

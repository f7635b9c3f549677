"""The HTTP API's request and response bodies: OpenAI's chat completions as clients send them,
and the sessions API. Pydantic checks every request before anything runs (400 with the field)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..model.prompt import Message
from ..model.reply_format import ReplyFormat, from_response_format
from ..reply import Reply

FINISH_REASONS = {"eos": "stop", "stop": "stop", "cache": "stop", "flow": "stop", "action": "stop", "handed_off": "stop", "length": "length", "cancelled": "stop"}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; `developer` is OpenAI's newer name for the system role."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return Message("system" if self.role == "developer" else self.role, text)


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


class ChatCompletionRequest(Generation):
    """`POST /v1/chat/completions`; fields this server does not use (`logprobs`, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(1, ge=1, le=1)
    user: str | None = Field(None, max_length=256)
    tools: list[dict[str, Any]] | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[dict[str, Any]] | None) -> None:
        if tools:
            raise ValueError("tool calling is not supported by this server yet")
        return None


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, min_length=1, max_length=90)
    title: str | None = Field(None, max_length=200)


class SessionMessage(Generation):
    """`POST /v1/sessions/{id}/messages`: the user's new message and its decoding settings."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1)


class AgentMessage(BaseModel):
    """`POST /v1/sessions/{id}/agent`: a person's reply in a session handed off to them."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1)
    agent: str = Field(min_length=1, max_length=128)


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


def served(reply: Reply, session_id: str | None, predicted_ttft_s: float | None) -> dict[str, Any]:
    """The `chatcache` extension field: where the answer came from and the turn's figures."""
    stats = reply.stats
    return {
        "session_id": session_id,
        "tier": stats.tier,
        "finish_reason": stats.finish_reason,
        "answer_cache_hit": stats.answer_cache_hit,
        "drift": stats.drift,
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
        "dropped_turns": stats.dropped_turns,
    }


def completion(cid: str, model: str, reply: Reply, extension: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": FINISH_REASONS.get(reply.stats.finish_reason, "stop"),
                "logprobs": None,
            }
        ],
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

"""`CachedChatModel`: a LangChain chat model on a `ChatEngine`, its token tier and answer cache.

Two ways a call is served:
  * the message-list path (default): the whole list LangChain sends is the conversation;
    `ChatEngine.complete` renders it and the token tier reuses the KV of the prefix an earlier call
    already computed, so only the new tail is prefilled;
  * the session path: with `config={"configurable": {"session_id": ...}}` and one new human
    message (system messages aside), the engine's own session keeps the history
    (`ChatEngine.stream`), in the session tier. When a history comes with the call (several
    turns, or a `RunnableWithMessageHistory`, which owns the history it sends), the session id
    only names the token-tier entry and the message-list path runs.

Tool calling (`bind_tools`) and structured output (`with_structured_output`, JSON mode) work on
any local model, the bundled 135M one included, because the engine's decoder is held to a
grammar (`ReplyFormat`): a call names a bound tool and its arguments validate against the
tool's schema; structured output validates against its schema. Tools, calls and results are
written in `chatcache.model.tools`' format. Free strings in those schemas are bounded so the
JSON can close within `max_tokens` (`within_budget`): a small model otherwise loops inside a
string until its budget ends. Non-text input (images, audio, files) is refused.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.caches import BaseCache
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.globals import get_llm_cache
from langchain_core.load import dumps
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages import InvalidToolCall, ToolCall, ToolCallChunk
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser, PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, Generation
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.runnables.config import ensure_config
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, model_validator
from transformers import PreTrainedTokenizerBase

from chatcache import CHOICE_NAMES, TOOL_ROUTE_THRESHOLD, CallSyntax, parse_calls, token_pieces

from ..engine import ChatEngine
from ..reply import Reply, ReplyStream
from ..reply_format import from_response_format
from .messages import to_chatcache

_CALL_PARAMS = ("max_tokens", "temperature", "top_p", "seed")


class CachedChatModel(BaseChatModel):
    """A LangChain chat model served by chatcache's hierarchical cache.

    Args:
        model: "bundled", a Hugging Face model id or a local directory (ignored when `engine` is
            given); default `$CHATCACHE_MODEL`, else "bundled". A call's `model=` runs that call
            on another model, whose engine is built on first use and kept, on the same session tier.
        engine: an existing `ChatEngine` to serve the calls; by default one is built from the other fields.
        system_prompt: the engine's system prompt, used when a call has no system message.
        max_tokens: reply tokens at most (`max_new_tokens` is accepted as an alias).
        temperature, top_p, seed: decoding; greedy at temperature 0.
        stop: stop sequences for every call (a call's `stop` replaces them).
        answer_cache: let the engine serve repeated questions from its answer cache.
        store: the session tier's SQLAlchemy URL; None for the data directory's database.
        tenant: answers are never shared across tenants.
        streaming: accepted for LangChain compatibility; streaming always works.
        tool_route_threshold: with tools bound and `tool_choice="auto"`, a question at least this
            close in meaning to a tool (`ToolRouter`) is answered by a call of it; None leaves
            every decision to the model (the bundled one then never calls).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    model: str = Field(default_factory=lambda: os.environ.get("CHATCACHE_MODEL", "bundled"))
    engine: Any = Field(default=None, exclude=True)
    system_prompt: str | None = None
    max_tokens: int = Field(default=256, alias="max_new_tokens", ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] | None = None
    answer_cache: bool = False
    store: str | None = None
    tenant: str = "default"
    streaming: bool = False
    tool_route_threshold: float | None = TOOL_ROUTE_THRESHOLD
    _engines: dict[str, ChatEngine] = PrivateAttr(default_factory=dict)  # per-call `model=` overrides

    @model_validator(mode="after")
    def _build_engine(self) -> CachedChatModel:
        if self.engine is None:
            self.engine = ChatEngine(
                model=self.model,
                system_prompt=self.system_prompt,
                answer_cache=self.answer_cache,
                store=self.store,
                tenant=self.tenant,
            )
        elif not isinstance(self.engine, ChatEngine):
            raise TypeError(f"engine must be a chatcache.ChatEngine, got {type(self.engine).__name__}")
        else:
            self.model = self.engine.chat_model.name
        return self

    # -- LangChain's description of the model --------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "chatcache"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # The weights' identity, not the object: an LLM cache key must survive a restart.
        return {
            "model": self.model,
            "identity": self.engine.chat_model.identity,
            "system_prompt": self.engine.system_prompt,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "tenant": self.tenant,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="chatcache",
            ls_model_name=kwargs["model"] if isinstance(kwargs.get("model"), str) else self.model,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def get_token_ids(self, text: str) -> list[int]:
        engine: ChatEngine = self.engine
        return engine.renderer.encode_text(text)

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        parallel_tool_calls: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind LangChain tools, pydantic models, functions or OpenAI tool dicts.

        Args:
            tool_choice: "auto" (default: text or a call), "any"/"required"/True (a call), "none"
                (text), a tool's name or `{"type": "function", "function": {"name": ...}}` (a call of it).
            parallel_tool_calls: let one reply call several tools; by default one call a reply,
                as a small model asked for one tends to repeat it.
            strict: accepted for compatibility; calls always hold to their schemas. Without
                `strict=False` an object takes no properties beyond those its schema lists.
        """
        formatted = [convert_to_openai_tool(tool, strict=strict is not False) for tool in tools]
        if isinstance(tool_choice, dict):
            tool_choice = tool_choice.get("function", {}).get("name") or tool_choice.get("type")
        choice = CHOICE_NAMES.get(tool_choice, tool_choice)
        names = [tool["function"]["name"] for tool in formatted]
        if choice not in ("auto", "any", "none") and choice not in names:
            raise ValueError(f"tool_choice {tool_choice!r} names no bound tool; bound: {', '.join(names)}")
        return super().bind(tools=formatted, tool_choice=choice, parallel_tool_calls=parallel_tool_calls, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type[Any] | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Replies parsed into `schema` (a pydantic model, a TypedDict or a JSON schema).

        Args:
            method: "json_schema" (the reply is JSON held to the schema), "function_calling"
                (the reply is a call of a tool whose arguments are the schema) or "json_mode"
                (a JSON object; held to the schema too when one is given, as for json_schema).
            include_raw: return `{"raw": AIMessage, "parsed": ..., "parsing_error": ...}`.
            strict: without `strict=False`, objects take no properties beyond their schema's (in
                JSON mode too, when it is given a schema).
        """
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if schema is None and method != "json_mode":
            raise ValueError(f"method {method!r} needs a schema")
        schema_given = schema is not None
        schema = schema if schema is not None else {"type": "object"}
        structured = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        parser: Runnable[Any, Any]
        if method == "function_calling":
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, strict=strict, ls_structured_output_format=structured, **kwargs)
            parser = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if pydantic
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        elif method in ("json_schema", "json_mode"):
            if method == "json_schema" or schema_given:
                # JSON mode promises an object only; held to the schema it was given too, the
                # reply also parses into it (a small model leaves out keys the prompt asked for,
                # and with little room left for strings, makes up keys it did not).
                parameters = convert_to_openai_tool(schema, strict=strict is not False)
                response_format = {"type": "json_schema", "json_schema": {"schema": parameters["function"]["parameters"]}}
            else:
                response_format = {"type": "json_object"}
            llm = self.bind(response_format=response_format, ls_structured_output_format=structured, **kwargs)
            parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()  # type: ignore[arg-type]
        else:
            raise ValueError(f"Unknown method {method!r}: use json_schema, function_calling or json_mode")
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")

    # -- the session id travels from the run config to the call --------------------------

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AIMessage:
        return super().invoke(input, config, stop=stop, **_with_session(config, kwargs))

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AIMessage:
        return await super().ainvoke(input, config, stop=stop, **_with_session(config, kwargs))

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        return super().stream(input, config, stop=stop, **_with_session(config, kwargs))

    def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        return super().astream(input, config, stop=stop, **_with_session(config, kwargs))

    # -- one call ----------------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply_stream, calls = self._start(messages, stop, kwargs)
        with reply_stream:  # a callback that raises cancels the generation
            for piece in reply_stream:
                if run_manager:
                    run_manager.on_llm_new_token(piece)
        reply = reply_stream.reply
        text = reply.text if reply else ""
        usage, metadata = self._report(reply, kwargs.get("model"))
        fields = _tool_fields(text, calls) if calls is not None else {"content": text}
        message = AIMessage(usage_metadata=usage, response_metadata=metadata, **fields)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        llm_cache, prompt, llm_string = self._llm_cache(messages, stop, kwargs)
        cached = llm_cache.lookup(prompt, llm_string) if llm_cache is not None else None
        if cached:
            yield from _replayed(cached[0], run_manager, self.engine.renderer.tokenizer)
            return
        reply_stream, calls = self._start(messages, stop, kwargs)
        streamed: list[ChatGenerationChunk] = []
        for chunk in self._stream_reply(reply_stream, calls, run_manager, kwargs):
            streamed.append(chunk)
            yield chunk
        reply = reply_stream.reply
        if llm_cache is not None and reply is not None and reply.stats.finish_reason != "cancelled":
            # Streamed answers fill LangChain's cache as invoked ones do (LangChain's own stream does not).
            whole = streamed[0]
            for chunk in streamed[1:]:
                whole += chunk
            message = AIMessage(**whole.message.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))
            llm_cache.update(prompt, llm_string, [ChatGeneration(message=message)])

    def _llm_cache(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[BaseCache | None, str, str]:
        """LangChain's LLM cache for this call (this model's own, else the global one), and the
        prompt and `llm_string` it is keyed by, as LangChain's invoke path keys them."""
        if self.cache is False:
            return None, "", ""
        llm_cache = self.cache if isinstance(self.cache, BaseCache) else get_llm_cache()
        if llm_cache is None:
            return None, "", ""
        normalized = [m.model_copy(update={"id": None}) if getattr(m, "id", None) is not None else m for m in messages]
        return llm_cache, dumps(normalized), self._get_llm_string(stop=stop, **kwargs)

    def _stream_reply(
        self,
        reply_stream: ReplyStream,
        calls: CallSyntax | None,
        run_manager: CallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> Iterator[ChatGenerationChunk]:
        """The engine's reply as chunks: text as it comes, a possible tool call (written in
        `calls`, where the reply may make them) held to its end."""
        held: list[str] | None = None  # a reply that may be a tool call is held until it ends
        syntax = calls
        with reply_stream:  # a reader that stops early cancels the generation
            for piece in reply_stream:
                if held is None and calls is not None and (kwargs.get("tool_choice") != "auto" or piece.startswith(calls.first)):
                    held = []
                if held is not None:
                    held.append(piece)
                    continue
                calls = None  # free text: a call cannot follow it
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
                yield chunk
        if held is not None and syntax is not None:
            fields = _tool_fields("".join(held), syntax)
            chunk = ChatGenerationChunk(
                message=AIMessageChunk(
                    content=fields["content"],
                    tool_call_chunks=_call_chunks(fields.get("tool_calls", [])),
                    invalid_tool_calls=fields.get("invalid_tool_calls", []),
                )
            )
            if run_manager:
                run_manager.on_llm_new_token("", chunk=chunk)
            yield chunk
        usage, metadata = self._report(reply_stream.reply, kwargs.get("model"))
        # Usage and metadata go on the last chunk only, so adding the chunks counts them once.
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", usage_metadata=usage, response_metadata=metadata, chunk_position="last")
        )

    def _start(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[ReplyStream, CallSyntax | None]:
        """Start the engine on the call; also how the model writes calls, where bound tools may make the reply one."""
        conversation = to_chatcache(messages)
        engine = self._engine_for(kwargs.get("model"))
        generation: dict[str, Any] = {name: kwargs.get(name, getattr(self, name)) for name in _CALL_PARAMS}
        generation["max_new_tokens"] = generation.pop("max_tokens")
        generation["stop"] = stop if stop is not None else self.stop
        tools = kwargs.get("tools") or []
        choice = kwargs.get("tool_choice") or "auto"
        if tools and kwargs.get("response_format"):
            raise ValueError("Bind tools or a response_format, not both: a reply is either a call or the structured answer.")
        if tools:
            generation.update(
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=bool(kwargs.get("parallel_tool_calls")),
                tool_route_threshold=self.tool_route_threshold if isinstance(messages[-1], HumanMessage) else None,
            )
        elif kwargs.get("response_format"):
            generation["reply_format"] = from_response_format(kwargs["response_format"], generation["max_new_tokens"])
        session_id = kwargs.get("session_id")
        turns = [m for m in conversation if m.role != "system"]
        if session_id and not tools and not kwargs.get("history_managed") and len(turns) == 1:
            systems = [m.content for m in conversation if m.role == "system"]
            if systems and systems != [engine.system_prompt]:
                raise ValueError(
                    "With a session_id the engine keeps the conversation and its system prompt: set "
                    "CachedChatModel(system_prompt=...) instead of sending a different SystemMessage."
                )
            return engine.stream(str(session_id), turns[0].content, **generation), None
        kv_key = f"lc-session:{session_id}" if session_id else None
        return engine.complete(conversation, kv_key=kv_key, **generation), engine.call_syntax if tools and choice != "none" else None

    def _engine_for(self, model: str | None) -> ChatEngine:
        """The engine that runs a call: this model's, or one on the call's `model=` override."""
        engine: ChatEngine = self.engine
        if model is None or model == self.model:
            return engine
        if model not in self._engines:
            self._engines[model] = ChatEngine(
                model=model,
                system_prompt=self.system_prompt,
                answer_cache=self.answer_cache,
                store=engine.store,
                tenant=self.tenant,
                embedder=engine.embed or "bundled",
            )
        return self._engines[model]

    def _report(self, reply: Reply | None, model: str | None) -> tuple[UsageMetadata, dict[str, Any]]:
        """LangChain's usage metadata and our cache report (read by `CacheStatsHandler`)."""
        stats = reply.stats if reply is not None else None
        prompt = stats.prompt_tokens if stats else 0
        generated = stats.generated_tokens if stats else 0
        reused = stats.reused_tokens if stats else 0
        usage = UsageMetadata(
            input_tokens=prompt,
            output_tokens=generated,
            total_tokens=prompt + generated,
            input_token_details={"cache_read": reused},
        )
        metadata: dict[str, Any] = {"model_name": model or self.model, "model_provider": "chatcache"}
        if stats is not None and reply is not None:
            metadata.update(
                finish_reason=stats.finish_reason,
                tier=stats.tier,
                reused_tokens=reused,
                prefilled_tokens=stats.prefilled_tokens,
                ttft_s=stats.ttft_s,
                answer_cache_hit=stats.answer_cache_hit,
                session_id=reply.session_id,
            )
        return usage, metadata


def _with_session(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Copy the run config's session id (and whether LangChain manages the history) into the call's kwargs."""
    configurable = ensure_config(config).get("configurable", {})
    session_id = configurable.get("session_id")
    if session_id is None or "session_id" in kwargs:
        return kwargs
    extra: dict[str, Any] = {"session_id": str(session_id)}
    if "message_history" in configurable:
        extra["history_managed"] = True  # RunnableWithMessageHistory sends the history it keeps
    return {**kwargs, **extra}


def _replayed(
    generation: Generation, run_manager: CallbackManagerForLLMRun | None, tokenizer: PreTrainedTokenizerBase
) -> Iterator[ChatGenerationChunk]:
    """A cached answer as a generated one streams: its text token by token through the callbacks,
    its tool calls as tool-call chunks, then its metadata (which marks the hit)."""
    message = generation.message if isinstance(generation, ChatGeneration) else AIMessage(generation.text)
    text = message.content if isinstance(message.content, str) else generation.text
    pieces = [] if getattr(message, "tool_calls", None) else token_pieces(tokenizer, text)
    for piece in pieces:
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if run_manager:
            run_manager.on_llm_new_token(piece, chunk=chunk)
        yield chunk
    yield ChatGenerationChunk(
        message=AIMessageChunk(
            content="" if pieces else text,
            tool_call_chunks=_call_chunks(getattr(message, "tool_calls", [])),
            usage_metadata=getattr(message, "usage_metadata", None),
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
    )


def _call_chunks(tool_calls: list[ToolCall]) -> list[ToolCallChunk]:
    """Whole tool calls as the chunks a stream carries them in (they add back up to the calls)."""
    return [
        ToolCallChunk(name=call["name"], args=json.dumps(call["args"]), id=call["id"], index=index, type="tool_call_chunk")
        for index, call in enumerate(tool_calls)
    ]


def _tool_fields(text: str, syntax: CallSyntax) -> dict[str, Any]:
    """An AI message's content and tool calls, read from a reply that may call tools."""
    try:
        head, calls = parse_calls(text, syntax)
    except ValueError as error:
        invalid = InvalidToolCall(name=None, args=text, id=_call_id(), error=str(error), type="invalid_tool_call")
        return {"content": text, "invalid_tool_calls": [invalid]}
    tool_calls = [ToolCall(name=call.name, args=call.arguments, id=call.id or _call_id(), type="tool_call") for call in calls]
    return {"content": head, "tool_calls": tool_calls}


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"

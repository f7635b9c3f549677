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

Tool calling, structured output and non-text input are not supported: a 135M local model
cannot do them reliably, so they fail loudly instead of producing plausible garbage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from pydantic import ConfigDict, Field, model_validator

from ..engine import ChatEngine
from ..reply import Reply, ReplyStream
from .messages import to_chatcache

_NO_TOOLS = (
    "CachedChatModel does not support tool calling or structured output: the local models it runs "
    "are not trained for it. Ask for the format in the prompt and parse the text instead."
)
_CALL_PARAMS = ("max_tokens", "temperature", "top_p", "seed")


class CachedChatModel(BaseChatModel):
    """A LangChain chat model served by chatcache's hierarchical cache.

    Args:
        model: "bundled", a Hugging Face model id or a local directory (ignored when `engine` is given).
        engine: an existing `ChatEngine` to serve the calls; by default one is built from the other fields.
        system_prompt: the engine's system prompt, used when a call has no system message.
        max_tokens: reply tokens at most (`max_new_tokens` is accepted as an alias).
        temperature, top_p, seed: decoding; greedy at temperature 0.
        stop: stop sequences for every call (a call's `stop` replaces them).
        answer_cache: let the engine serve repeated questions from its answer cache.
        store: the session tier's SQLAlchemy URL; None for the data directory's database.
        tenant: answers are never shared across tenants.
        streaming: accepted for LangChain compatibility; streaming always works.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    model: str = "bundled"
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

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Any:
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError(_NO_TOOLS)

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any) -> Any:
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError(_NO_TOOLS)

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
        reply_stream = self._start(messages, stop, kwargs)
        for piece in reply_stream:
            if run_manager:
                run_manager.on_llm_new_token(piece)
        reply = reply_stream.reply
        text = reply.text if reply else ""
        usage, metadata = self._report(reply)
        message = AIMessage(content=text, usage_metadata=usage, response_metadata=metadata)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        reply_stream = self._start(messages, stop, kwargs)
        try:
            for piece in reply_stream:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
                yield chunk
        finally:
            reply_stream.close()  # a reader that stops early cancels the generation
        usage, metadata = self._report(reply_stream.reply)
        # Usage and metadata go on the last chunk only, so adding the chunks counts them once.
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", usage_metadata=usage, response_metadata=metadata, chunk_position="last")
        )

    def _start(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> ReplyStream:
        conversation = to_chatcache(messages)
        engine: ChatEngine = self.engine
        generation: dict[str, Any] = {name: kwargs.get(name, getattr(self, name)) for name in _CALL_PARAMS}
        generation["max_new_tokens"] = generation.pop("max_tokens")
        generation["stop"] = stop if stop is not None else self.stop
        session_id = kwargs.get("session_id")
        turns = [m for m in conversation if m.role != "system"]
        if session_id and not kwargs.get("history_managed") and len(turns) == 1:
            systems = [m.content for m in conversation if m.role == "system"]
            if systems and systems != [engine.system_prompt]:
                raise ValueError(
                    "With a session_id the engine keeps the conversation and its system prompt: set "
                    "CachedChatModel(system_prompt=...) instead of sending a different SystemMessage."
                )
            return engine.stream(str(session_id), turns[0].content, **generation)
        kv_key = f"lc-session:{session_id}" if session_id else None
        return engine.complete(conversation, kv_key=kv_key, **generation)

    def _report(self, reply: Reply | None) -> tuple[UsageMetadata, dict[str, Any]]:
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
        metadata: dict[str, Any] = {"model_name": self.model, "model_provider": "chatcache"}
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

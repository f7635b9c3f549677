"""LangChain's standard chat-model tests: unit tests on the tiny model, integration tests on the bundled one.

Tool calling, tool choice, structured output, JSON mode, Anthropic-format input (text, tool use,
thinking), per-call model override and initialisation from the environment are declared
supported (decoding held to the schemas makes tools work on the bundled 135M model); image,
audio and PDF input are declared unsupported, so their tests skip themselves. One more skips:
serialisation, which langchain-core's `load` allows only for the classes it registers itself
(`allowed_objects="all"` is its own partners), so no package outside LangChain can pass it.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from chatcache.langchain import CachedChatModel

pytestmark = pytest.mark.anyio


class _Unsupported:
    """What a local text model does, and what it does not (non-text input)."""

    @property
    def chat_model_class(self) -> type[CachedChatModel]:
        return CachedChatModel

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def enable_vcr_tests(self) -> bool:
        return True  # a local model makes no HTTP calls: the stream-time test just runs

    @property
    def model_override_value(self) -> str:
        return str(self._other_model)


class TestCachedChatModelUnit(_Unsupported, ChatModelUnitTests):
    @pytest.fixture(autouse=True)
    def _models(self, bundled_model, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
        """"bundled" (loaded once per process); the tiny model is the other model a call or
        `$CHATCACHE_MODEL` may name."""
        self._params = {"model": "bundled"}
        self._other_model = tiny_model_dir

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return self._params

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return {"CHATCACHE_MODEL": str(self._other_model)}, {}, {"model": str(self._other_model)}


@pytest.mark.bundled
class TestCachedChatModelIntegration(_Unsupported, ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _bundled(self, bundled_model, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
        """Load the bundled model from the shared test dir first; "bundled" then resolves to it
        (per-process cache). The tiny model is the other model a call may ask for."""
        self._other_model = tiny_model_dir

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Enough tokens for a tool call or a two-field JSON object (strings are bounded to fit).
        return {"model": "bundled", "max_tokens": 64}

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:  # type: ignore[override]
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """A second call that repeats the first's conversation reads its prefix from the token tier."""
        model = CachedChatModel(**self.chat_model_params)
        first = model.invoke([HumanMessage("Hello")])
        messages = [HumanMessage("Hello"), first, HumanMessage("How are you?")]
        if not stream:
            reply = model.invoke(messages)
        else:
            full: AIMessageChunk | None = None
            for chunk in model.stream(messages):
                full = chunk if full is None else full + chunk
            assert full is not None
            reply = full
        assert reply.usage_metadata is not None
        assert reply.usage_metadata["input_token_details"]["cache_read"] > 0
        return reply  # type: ignore[return-value]

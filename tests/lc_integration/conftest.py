"""Fixtures for the LangChain integration: models on the tiny Llama, the async backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def lc_model(tiny_model, make_engine):  # type: ignore[no-untyped-def]
    """Build `CachedChatModel`s on the tiny model; `cached=False` turns the token tier off (the uncached path)."""
    from chatcache import TokenTierConfig
    from chatcache.langchain import CachedChatModel

    def make(cached: bool = True, max_tokens: int = 8, **kwargs):  # type: ignore[no-untyped-def]
        engine_kwargs = {k: kwargs.pop(k) for k in ("system_prompt", "answer_cache", "embedder") if k in kwargs}
        engine = make_engine(tiny_model, token_tier=TokenTierConfig(enabled=cached), **engine_kwargs)
        return CachedChatModel(engine=engine, max_tokens=max_tokens, **kwargs)

    return make


def pytest_configure(config: pytest.Config) -> None:
    # langchain-tests marks its recorded-HTTP benchmark with `vcr`; registered here too in case pytest-recording is absent.
    config.addinivalue_line("markers", "vcr: recorded HTTP calls (unused by a local model)")

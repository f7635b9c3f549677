"""SemanticCache: LangChain's standard cache suites, persistence, scoping, and use with any model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.outputs import Generation
from langchain_tests.integration_tests import AsyncCacheTestSuite, SyncCacheTestSuite

from chatcache.langchain import CacheStatsHandler, SemanticCache

pytestmark = pytest.mark.anyio


class TestSemanticCacheSync(SyncCacheTestSuite):
    @pytest.fixture
    def cache(self, tmp_path, toy_embed) -> SemanticCache:  # type: ignore[no-untyped-def]
        return SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)


class TestSemanticCacheAsync(AsyncCacheTestSuite):
    @pytest.fixture
    def cache(self, tmp_path, toy_embed) -> SemanticCache:  # type: ignore[no-untyped-def]
        return SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)


def test_entries_persist_across_instances_and_clear_removes_them(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/llm.db"
    SemanticCache(url, embed=toy_embed).update("What is the capital of France?", "m", [Generation(text="Paris")])
    reopened = SemanticCache(url, embed=toy_embed)
    assert reopened.lookup("What is the capital of France?", "m") == [Generation(text="Paris")]
    reopened.clear()
    assert SemanticCache(url, embed=toy_embed).lookup("What is the capital of France?", "m") is None


def test_default_database_is_in_the_data_dir(toy_embed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    SemanticCache(embed=toy_embed).update("q", "m", [Generation(text="a")])
    assert (tmp_path / "data" / "langchain-cache.db").is_file()


def test_a_rephrased_question_hits_but_other_context_or_model_settings_miss(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)
    cache.update("What is the capital of France?", "model-a", [Generation(text="Paris")])
    assert cache.lookup("what is the capital of france, please", "model-a") == [Generation(text="Paris")]
    assert cache.lookup("What is the capital of France?", "model-b") is None
    assert cache.lookup("What is the capital of Spain?", "model-a") is None  # verification: another entity


def test_any_chat_model_is_served_from_it_within_its_conversation(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)
    model = FakeListChatModel(responses=["first", "second", "third"], cache=cache)
    stats = CacheStatsHandler()
    question = [SystemMessage("Be brief."), HumanMessage("How old is he?")]
    assert model.invoke(question).content == "first"
    assert model.invoke(question, config={"callbacks": [stats]}).content == "first"  # served, model not run
    assert stats.calls[-1].tier == "llm_cache" and stats.calls[-1].answer_cache_hit
    after_other_turns = [HumanMessage("Who is Bob?"), AIMessage("A pilot."), HumanMessage("How old is he?")]
    assert model.invoke(after_other_turns).content == "second"  # same question, other conversation
    assert cache.stats().entries == 2


def test_concurrent_lookups_and_updates(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)
    prompts = [f"question number {i} about trains to berlin" for i in range(24)]

    def roundtrip(index: int) -> list[Generation] | None:
        cache.update(prompts[index], "m", [Generation(text=f"answer {index}")])
        return cache.lookup(prompts[index], "m")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(roundtrip, range(len(prompts))))
    assert results == [[Generation(text=f"answer {i}")] for i in range(len(prompts))]
    assert SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed).stats().entries == len(prompts)


async def test_async_calls_run_off_the_event_loop(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    import threading

    seen: list[str] = []

    def embed(texts):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return toy_embed(texts)

    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=embed)
    await cache.aupdate("a question about cats", "m", [Generation(text="meow")])
    assert await cache.alookup("a question about cats", "m") == [Generation(text="meow")]
    assert seen and threading.main_thread().name not in seen


def test_update_overwrites_like_any_langchain_cache(tmp_path, toy_embed) -> None:  # type: ignore[no-untyped-def]
    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)
    cache.update("What is the capital of France?", "m", [Generation(text="Lyon")])
    cache.update("What is the capital of France?", "m", [Generation(text="Paris")])
    assert cache.lookup("What is the capital of France?", "m") == [Generation(text="Paris")]

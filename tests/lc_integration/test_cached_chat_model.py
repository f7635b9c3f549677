"""CachedChatModel on the tiny model: the cached paths give what the uncached path gives, and say how they were served."""

from __future__ import annotations

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, FunctionMessage, HumanMessage, SystemMessage

from chatcache.langchain import CachedChatModel, SemanticCache

pytestmark = pytest.mark.anyio

SYSTEM = "You are a helpful assistant."
QUESTIONS = ["Hello! How are you doing today?", "Tell me a joke about cats.", "What is the weather like in Paris?"]


def _converse(model: CachedChatModel) -> list[AIMessage]:
    messages: list = [SystemMessage(SYSTEM)]
    replies = []
    for question in QUESTIONS:
        messages.append(HumanMessage(question))
        reply = model.invoke(messages)
        messages.append(reply)
        replies.append(reply)
    return replies


def test_message_list_reuses_the_prefix_and_matches_the_uncached_path(lc_model) -> None:  # type: ignore[no-untyped-def]
    cached, uncached = _converse(lc_model()), _converse(lc_model(cached=False))
    assert [r.content for r in cached] == [r.content for r in uncached]
    for turn, (c, u) in enumerate(zip(cached, uncached)):
        assert c.usage_metadata["input_tokens"] == u.usage_metadata["input_tokens"]
        assert u.usage_metadata["input_token_details"]["cache_read"] == 0
        assert c.usage_metadata["input_token_details"]["cache_read"] == c.response_metadata["reused_tokens"]
        assert c.usage_metadata["total_tokens"] == c.usage_metadata["input_tokens"] + c.usage_metadata["output_tokens"]
        if turn > 0:  # everything up to the previous reply's last token was computed by the last call
            previous = cached[turn - 1]
            assert c.response_metadata["tier"] == "session"
            assert c.response_metadata["reused_tokens"] == (
                previous.usage_metadata["input_tokens"] + previous.usage_metadata["output_tokens"] - 1
            )


def test_stream_gives_the_invoke_text_with_usage_on_the_last_chunk(lc_model) -> None:  # type: ignore[no-untyped-def]
    model = lc_model()
    expected = lc_model(cached=False).invoke([HumanMessage(QUESTIONS[0])])
    chunks = list(model.stream([HumanMessage(QUESTIONS[0])]))
    assert "".join(c.content for c in chunks) == expected.content
    assert chunks[-1].chunk_position == "last"
    assert [c.usage_metadata is not None for c in chunks].count(True) == 1
    assert chunks[-1].usage_metadata["output_tokens"] == expected.usage_metadata["output_tokens"]


def test_stop_sequence_cuts_the_reply(lc_model) -> None:  # type: ignore[no-untyped-def]
    model = lc_model(max_tokens=16)
    full = model.invoke(QUESTIONS[1]).content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), "the tiny model's reply has text to cut"
    cut = lc_model(max_tokens=16).invoke(QUESTIONS[1], stop=[stop])
    assert cut.content == full[: full.index(stop)]
    assert cut.response_metadata["finish_reason"] == "stop"
    assert lc_model(max_tokens=16, stop=[stop]).invoke(QUESTIONS[1]).content == cut.content


def test_session_id_uses_the_engine_session(lc_model, tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    model = lc_model(system_prompt=SYSTEM)
    config = {"configurable": {"session_id": "s-1"}}
    first = model.invoke(QUESTIONS[0], config=config)
    second = model.invoke(QUESTIONS[1], config=config)
    assert second.response_metadata["tier"] == "session" and second.response_metadata["reused_tokens"] > 0
    assert [m.content for m in model.engine.sessions.history("s-1")] == [QUESTIONS[0], first.content, QUESTIONS[1], second.content]
    reference = make_engine(tiny_model, system_prompt=SYSTEM)
    assert [reference.chat("r", q, max_new_tokens=8).text for q in QUESTIONS[:2]] == [first.content, second.content]
    with pytest.raises(ValueError, match="system_prompt"):
        model.invoke([SystemMessage("Something else."), HumanMessage("hi")], config=config)


async def test_async_and_batch_match_sync(lc_model) -> None:  # type: ignore[no-untyped-def]
    model = lc_model()
    expected = [lc_model(cached=False).invoke(q).content for q in QUESTIONS[:2]]
    assert [m.content for m in model.batch(QUESTIONS[:2])] == expected
    assert [m.content for m in await model.abatch(QUESTIONS[:2])] == expected
    assert (await model.ainvoke(QUESTIONS[0])).content == expected[0]
    assert "".join([c.content async for c in model.astream(QUESTIONS[0])]) == expected[0]


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        ([], "empty message list"),
        ([HumanMessage("hi"), FunctionMessage("42", name="f")], "FunctionMessage"),
        ([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])], "'image_url'"),
        ([HumanMessage(content=[{"type": "image", "base64": "AAAA", "mime_type": "image/png"}])], "'image'"),
        (
            [HumanMessage("hi"), AIMessage("", invalid_tool_calls=[{"name": "f", "args": "{", "id": "1", "error": "cut"}])],
            "invalid_tool_calls",
        ),
        ([HumanMessage("hi"), AIMessage("hello")], "last message must be a HumanMessage or a ToolMessage"),
        ([HumanMessage("   ")], "empty"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_cached(lc_model, toy_embed, tmp_path, messages, named) -> None:  # type: ignore[no-untyped-def]
    cache = SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed)
    model = lc_model(cache=cache)
    with pytest.raises(ValueError, match=named):
        model.invoke(messages)
    assert cache.stats().entries == 0
    assert model.engine.kv_stats().sessions_in_memory == 0


@pytest.mark.bundled
def test_answer_cache_serves_a_repeated_question_without_the_model(bundled_model, make_engine, toy_embed) -> None:  # type: ignore[no-untyped-def]
    model = CachedChatModel(engine=make_engine(bundled_model, answer_cache=True, embedder=toy_embed), max_tokens=24)
    messages = [SystemMessage(SYSTEM), HumanMessage("What is the capital of France?")]
    first = model.invoke(messages)
    assert first.response_metadata["finish_reason"] == "eos"
    again = model.invoke(messages)
    assert again.response_metadata["answer_cache_hit"] and again.response_metadata["tier"] == "answer"
    assert again.content == first.content and again.usage_metadata["input_tokens"] == 0
    # A hit streams as a generated answer does: several chunks, each through the callbacks.
    handler = _Tokens()
    chunks = list(model.stream(messages, config={"callbacks": [handler]}))
    texts = [chunk.content for chunk in chunks if chunk.content]
    assert len(texts) > 1 and "".join(texts) == first.content and [t for t in handler.tokens if t] == texts
    assert chunks[-1].response_metadata["answer_cache_hit"]


class _Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: object) -> None:
        self.tokens.append(token)


@pytest.mark.parametrize("text", ["hi\ud800", "hi\x00there"], ids=["lone surrogate", "NUL"])
def test_a_message_no_database_can_store_is_refused_before_the_model_runs(lc_model, text: str) -> None:  # type: ignore[no-untyped-def]
    from chatcache import InvalidMessageError

    with pytest.raises(InvalidMessageError, match="remove that character"):
        lc_model().invoke([HumanMessage(text)])


def test_many_conversations_keep_the_engines_memory_within_its_bound(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    """Each LangChain conversation has its own token-tier key: past the engine's memory bound the
    least recently used ones are let go of (KV, heat, and the key with its lock)."""
    from chatcache import MemoryConfig

    engine = make_engine(tiny_model, memory=MemoryConfig(max_sessions_in_memory=5))
    model = CachedChatModel(engine=engine, max_tokens=2)
    for index in range(20):
        model.invoke([SystemMessage(SYSTEM), HumanMessage(f"conversation {index}")])
        assert engine.kv_stats().sessions_with_heat <= 5  # the structure that used to grow
        assert len(engine.sessions.held_in_memory()) <= 5


def test_langchain_cache_hits_stream_like_generated_answers(lc_model, toy_embed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """LangChain's own stream skips its LLM cache; ours serves a hit through it, token by token and
    through the callbacks, marked in the metadata, and a streamed answer fills the cache."""
    model = lc_model(max_tokens=16, cache=SemanticCache(f"sqlite:///{tmp_path}/llm.db", embed=toy_embed))
    messages = [SystemMessage(SYSTEM), HumanMessage("Tell me a joke about cats.")]
    streamed = list(model.stream(messages))  # a miss: generated, then stored
    generated = "".join(str(chunk.content) for chunk in streamed)
    assert not streamed[-1].response_metadata["answer_cache_hit"]
    invoked = model.invoke(messages)
    assert invoked.response_metadata["tier"] == "llm_cache" and invoked.content == generated
    handler = _Tokens()
    again = list(model.stream(messages, config={"callbacks": [handler]}))
    pieces = [str(chunk.content) for chunk in again if chunk.content]
    assert len(pieces) > 1 and "".join(pieces) == generated and [t for t in handler.tokens if t] == pieces
    assert again[-1].response_metadata["tier"] == "llm_cache"

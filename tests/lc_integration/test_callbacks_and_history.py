"""CacheStatsHandler in an LCEL chain, and SessionChatHistory under RunnableWithMessageHistory."""

from __future__ import annotations

import warnings

import pytest
from langchain_core.messages import AIMessage, FunctionMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from chatcache.langchain import CacheStatsHandler, SessionChatHistory

SYSTEM = "You are a helpful assistant."


def test_stats_handler_sees_each_call_of_an_lcel_chain(lc_model) -> None:  # type: ignore[no-untyped-def]
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])
    chain = prompt | lc_model() | StrOutputParser()
    stats = CacheStatsHandler()
    first = chain.invoke({"question": "Tell me a joke about cats."}, config={"callbacks": [stats]})
    second = chain.invoke({"question": "Tell me a joke about cats."}, config={"callbacks": [stats]})
    assert first == second
    assert [c.tier for c in stats.calls] == ["prefix", "session"]  # system prompt's KV, then the whole prefix
    assert stats.calls[1].reused_tokens == stats.calls[1].input_tokens - 1
    assert all(c.ttft_s is not None and c.ttft_s > 0 for c in stats.calls)
    summary = stats.summary()
    assert summary.calls == 2 and summary.reused_tokens == sum(c.reused_tokens for c in stats.calls)


def _chain(model, url):  # type: ignore[no-untyped-def]
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{question}")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RunnableWithMessageHistory is deprecated in favour of LangGraph
        return RunnableWithMessageHistory(
            prompt | model | StrOutputParser(),
            lambda session_id: SessionChatHistory(session_id, store=url),
            input_messages_key="question",
            history_messages_key="history",
        )


def test_runnable_with_message_history_keeps_history_in_the_session_tier(lc_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/history.db"
    stats = CacheStatsHandler()
    chain = _chain(lc_model(), url)
    config = {"configurable": {"session_id": "ada"}, "callbacks": [stats]}
    answers = [chain.invoke({"question": q}, config=config) for q in ("Hello!", "Tell me a joke about cats.")]

    stored = SessionChatHistory("ada", store=url).messages  # a new instance: read back from the database
    assert [type(m) for m in stored] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert [m.content for m in stored] == ["Hello!", answers[0], "Tell me a joke about cats.", answers[1]]
    assert stats.calls[1].tier == "session" and stats.calls[1].reused_tokens > 0

    # The same chain on the uncached path (token tier off) answers the same.
    reference = _chain(lc_model(cached=False), f"sqlite:///{tmp_path}/reference.db")
    config = {"configurable": {"session_id": "ada"}}
    assert [reference.invoke({"question": q}, config=config) for q in ("Hello!", "Tell me a joke about cats.")] == answers


def test_history_refuses_what_it_cannot_store_and_clears(tmp_path) -> None:  # type: ignore[no-untyped-def]
    history = SessionChatHistory("s", store=f"sqlite:///{tmp_path}/history.db")
    with pytest.raises(ValueError, match="FunctionMessage"):
        history.add_messages([HumanMessage("hi"), FunctionMessage("42", name="f")])
    assert history.messages == []  # checked before anything was written
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    assert len(history.messages) == 2
    history.clear()
    assert history.messages == []

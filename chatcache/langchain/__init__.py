"""LangChain integration: chatcache's cache tiers behind LangChain's chat model, cache, callback and history APIs.

    CachedChatModel     a `BaseChatModel` on a `ChatEngine`: the token tier reuses the KV of the
                        conversation prefix across calls; optional answer cache and sessions
    SemanticCache       a `BaseCache` for `set_llm_cache`, on the answer cache (any LangChain model)
    CacheStatsHandler   a callback handler recording which tier served each call
    SessionChatHistory  a `BaseChatMessageHistory` in the session tier's database

A chain that keeps its history in chatcache's database:

    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory
    from chatcache.langchain import CacheStatsHandler, CachedChatModel, SessionChatHistory

    model = CachedChatModel(model="bundled", max_tokens=64)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a concise assistant."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model | StrOutputParser(),
        lambda session_id: SessionChatHistory(session_id, store="sqlite:///chat.db"),
        input_messages_key="question",
        history_messages_key="history",
    )
    stats = CacheStatsHandler()
    config = {"configurable": {"session_id": "ada-1"}, "callbacks": [stats]}
    chain.invoke({"question": "Name a French cheese."}, config=config)
    chain.invoke({"question": "And an Italian one?"}, config=config)
    print(stats.calls[-1].tier, stats.calls[-1].reused_tokens)  # "session": the first turn's KV was reused

This package needs `langchain-core`; the rest of chatcache does not import it.
"""

from .callbacks import CacheStatsHandler, CacheSummary, CallStats
from .chat_model import CachedChatModel
from .history import SessionChatHistory
from .semantic_cache import SemanticCache

__all__ = [
    "CacheStatsHandler",
    "CacheSummary",
    "CachedChatModel",
    "CallStats",
    "SemanticCache",
    "SessionChatHistory",
]

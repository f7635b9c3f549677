"""`SemanticCache`: chatcache's answer cache as LangChain's LLM cache (`set_llm_cache`).

LangChain hands a cache the prompt as one string (for chat models, the message list
serialised with `dumps`) and `llm_string`, the model and its settings. The question is the
last message's text; the scope's context is a fingerprint of `llm_string` and of every
earlier message, so an answer is only served to the same model, settings and conversation,
and a follow-up ("and in French?") never meets another conversation's answer. Within that
scope the answer cache matches the question exactly or by meaning (its embedding, the vote
and the verification checks); every caller shares the cache, so an answer found by meaning
is refused when it repeats particulars of its own question that this one lacks. The value stored is LangChain's list of generations, serialised.

Entries live in their own SQLite file in the data directory by default (not in the engine's
`chatcache.db`), so `clear()` empties this cache and never the engine's answer cache.
An `update` for a question already cached in the same scope replaces its answer, as any
LangChain cache does.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Sequence
from typing import Any

from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
from langchain_core.load import dumps, loads
from langchain_core.outputs import ChatGeneration

from chatcache import Embed, load_embedder, sentence_embed
from chatcache.storage import SessionStore

from ..answer_cache import AnswerCache, AnswerCacheConfig, Scope, conversation_context
from ..config import default_data_dir

DEFAULT_FILE = "langchain-cache.db"
_MODEL = "langchain"  # the scope's model field: llm_string, in the context, names the real one


def split_prompt(prompt: str) -> tuple[str, list[tuple[str, str]]]:
    """The question and the earlier (role, text) messages of a LangChain cache prompt.

    A chat model's prompt is its messages serialised with `dumps`; anything else (an LLM's
    plain prompt, or a format we cannot read) is the question as a whole.
    """
    try:
        items = json.loads(prompt)
    except ValueError:
        return prompt, []
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        return prompt, []
    messages = []
    for item in items:
        kwargs = item.get("kwargs", {})
        role = str(kwargs.get("type") or (item.get("id") or ["?"])[-1])
        messages.append((role, _text(kwargs.get("content", ""))))
    return messages[-1][1] or prompt, messages[:-1]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: text stays text, anything else by its JSON
        return " ".join(b if isinstance(b, str) else str(b.get("text") or json.dumps(b, sort_keys=True)) for b in content)
    return json.dumps(content, sort_keys=True, default=str)


def _marked(generation: Any) -> Any:
    """A cached chat reply says so in its metadata (`CacheStatsHandler` reads it), not how it was first made."""
    if not isinstance(generation, ChatGeneration):
        return generation
    served = {"tier": "llm_cache", "answer_cache_hit": True, "reused_tokens": 0, "prefilled_tokens": 0, "ttft_s": None}
    message = generation.message.model_copy(update={"response_metadata": {**generation.message.response_metadata, **served}})
    return generation.model_copy(update={"message": message})


def _context(llm_string: str, earlier: Sequence[tuple[str, str]]) -> str:
    """The engine's follow-up fingerprint; the model and its settings stand in for the owner."""
    return conversation_context(llm_string, earlier)


class SemanticCache(BaseCache):
    """A persistent, semantic LLM cache for any LangChain model.

    Args:
        db_url: SQLAlchemy URL of the database; None for `langchain-cache.db` in the data directory.
        embed: texts to unit-normalised rows; by default the bundled sentence embedder.
        config: the answer cache's thresholds, TTL and capacity (verification on by default).
        tenant: entries are never shared across tenants.

    Example:
        from langchain_core.globals import set_llm_cache
        set_llm_cache(SemanticCache("sqlite:///answers.db"))
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        embed: Embed | None = None,
        config: AnswerCacheConfig | None = None,
        tenant: str = "default",
    ) -> None:
        if db_url is None:
            directory = default_data_dir()
            directory.mkdir(parents=True, exist_ok=True)
            db_url = f"sqlite:///{directory / DEFAULT_FILE}"
        self.store = SessionStore(db_url)
        self.tenant = tenant
        self._answers = AnswerCache(
            config or AnswerCacheConfig(), embed or sentence_embed(load_embedder("bundled")), self.store.answers
        )

    def _key(self, prompt: str, llm_string: str) -> tuple[str, Scope]:
        question, earlier = split_prompt(prompt)
        return question, Scope(_MODEL, "", self.tenant, _context(llm_string, earlier))

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        question, scope = self._key(prompt, llm_string)
        # Every caller of this cache shares it: an answer found by meaning must not echo another question.
        hit = self._answers.lookup(question, scope, across_users=True)
        if hit is None:
            return None
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*is in beta")  # `loads` is marked beta
                generations = loads(hit.answer, allowed_objects="core")
        except Exception:  # noqa: BLE001 - an entry we cannot revive is a miss, not an error
            return None
        return [_marked(g) for g in generations]

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        question, scope = self._key(prompt, llm_string)
        # LangChain's models are not ours to measure: entropy is unknown, so it never refuses.
        self._answers.store(question, dumps(list(return_val)), scope, entropy_bits=0.0, latency_ms=0.0, overwrite=True)

    def clear(self, **kwargs: Any) -> None:
        self._answers.clear()

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return await asyncio.to_thread(self.lookup, prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        await asyncio.to_thread(self.update, prompt, llm_string, return_val)

    async def aclear(self, **kwargs: Any) -> None:
        await asyncio.to_thread(self.clear)

    def stats(self) -> Any:
        """The answer cache's counters (lookups, hits, exact and semantic hits, entries)."""
        return self._answers.snapshot()

    def close(self) -> None:
        self.store.close()

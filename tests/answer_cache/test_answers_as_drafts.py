"""Cached answers the cache does not serve are drafts for the model's reply: from the turn's
own scope only, and the reply is the one the model writes without them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from chatcache import ChatModel
from chatcache.answer_cache import AnswerCacheConfig, AnswerScope
from chatcache.steering.hcac import TurnContext

SYSTEM = "You are a helpful assistant."
STORE_ALL = AnswerCacheConfig(max_entropy_bits=100.0)
# The tiny random model's reply to QUESTION is whole characters, so its text is its tokens again.
QUESTION = "Tell me about the dog."
STORED_QUESTION = "What can you tell me about dogs?"  # near QUESTION, too far to be served for it


@pytest.fixture
def drafting_model(tiny_model):  # type: ignore[no-untyped-def]
    model = ChatModel(tiny_model.name, tiny_model.model, tiny_model.tokenizer, tiny_model.identity)
    yield model
    model.close()


def _offered(engine, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """What the engine's turns are offered as drafts, turn by turn."""
    offered: list[list[str]] = []
    near: Callable[[str, AnswerScope, TurnContext], list[str]] = engine.answers.near

    def recorded(text: str, where: AnswerScope, context: TurnContext) -> list[str]:
        offered.append(near(text, where, context))
        return offered[-1]

    monkeypatch.setattr(engine.answers, "near", recorded)
    return offered


def test_a_turn_drafts_from_a_near_cached_answer_and_replies_as_without(drafting_model, make_engine, toy_embed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The model's reply to a question, cached for a nearby one, drafts most of the same reply."""
    drafting_model.scheduler.draft_tokens = 0
    plain = make_engine(drafting_model, system_prompt=SYSTEM, answer_cache=STORE_ALL, embedder=toy_embed).chat("s", QUESTION, max_new_tokens=12)
    assert plain.stats.drafted_tokens == 0
    assert drafting_model.tokenizer.encode(plain.text, add_special_tokens=False) == plain.token_ids
    drafting_model.scheduler.draft_tokens = 4
    engine = make_engine(drafting_model, system_prompt=SYSTEM, answer_cache=STORE_ALL, embedder=toy_embed)
    engine.sessions.create("s")
    where = engine.turns.answer_scope("s", QUESTION)  # the scope the session's next turn searches
    assert where is not None and engine.answer_cache.store(STORED_QUESTION, plain.text, where.scope, entropy_bits=0.0, latency_ms=1.0)
    offered = _offered(engine, monkeypatch)
    drafted = engine.chat("s", QUESTION, max_new_tokens=12)
    assert not drafted.stats.answer_cache_hit  # the model wrote it
    assert offered == [[plain.text]]
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.accepted_tokens >= len(plain.token_ids) // 2
    assert drafted.stats.accepted_tokens <= drafted.stats.drafted_tokens


def test_another_users_follow_up_answer_is_never_a_draft(drafting_model, make_engine, toy_embed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A follow-up's answer cached for another user after the same conversation is not offered,
    nor is any answer to a turn that carries personal data (it has no scope)."""
    drafting_model.scheduler.draft_tokens = 4
    engine = make_engine(drafting_model, system_prompt=SYSTEM, answer_cache=STORE_ALL, embedder=toy_embed)
    engine.chat("s", "Hello there.", max_new_tokens=4)
    # Another user of the same bot and model, after the same conversation.
    other = make_engine(drafting_model, system_prompt=SYSTEM, answer_cache=STORE_ALL, embedder=toy_embed, user_id="someone-else")
    other.chat("t", "Hello there.", max_new_tokens=4)
    assert other.sessions.history("t") == engine.sessions.history("s")
    mine, theirs = engine.turns.answer_scope("s", QUESTION), other.turns.answer_scope("t", QUESTION)
    assert mine is not None and theirs is not None and not theirs.across_users
    assert engine.answer_cache.store(QUESTION, "an answer only they may see", theirs.scope, entropy_bits=0.0, latency_ms=1.0)
    offered = _offered(engine, monkeypatch)
    engine.chat("s", QUESTION, max_new_tokens=4)
    assert offered == [[]]
    engine.chat("s", "My account number is 12345674, what is the weather?", max_new_tokens=4)
    assert offered == [[]]  # personal data: no scope, not even asked
    # The same answer in this user's own scope after that conversation would have been offered.
    assert engine.answer_cache.store(QUESTION, "an answer of mine", mine.scope, entropy_bits=0.0, latency_ms=1.0)
    assert engine.answers.near(QUESTION, mine, TurnContext()) == ["an answer of mine"]

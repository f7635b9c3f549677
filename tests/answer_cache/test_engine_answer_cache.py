"""On the real model: a served answer is the answer the model gives in that place."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache import TokenTierConfig
from chatcache.answer_cache import AnswerCacheConfig

pytestmark = pytest.mark.bundled
SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTION = "What is the capital of France?"


@pytest.fixture
def build(make_engine, bundled_model, tmp_path: Path):  # type: ignore[no-untyped-def]
    def engine(**kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("store", f"sqlite:///{tmp_path}/shared.db")
        kwargs.setdefault("token_tier", TokenTierConfig(spill_dir=None))
        return make_engine(bundled_model, system_prompt=SYSTEM, **kwargs)

    return engine


def test_a_repeated_question_is_served_with_the_models_own_answer(build, make_engine, bundled_model) -> None:  # type: ignore[no-untyped-def]
    engine = build(answer_cache=True)
    first = engine.chat("a", QUESTION, max_new_tokens=48)
    assert first.stats.finish_reason == "eos" and not first.stats.answer_cache_hit
    again = engine.chat("b", "what is the capital of france", max_new_tokens=48)
    assert again.stats.answer_cache_hit and again.stats.tier == "answer"
    uncached = make_engine(bundled_model, system_prompt=SYSTEM)
    assert again.text == first.text == uncached.chat("x", "what is the capital of france", max_new_tokens=48).text
    assert engine.answer_cache.snapshot().hits == 1


def test_under_a_bound_a_fresh_scope_serves_its_repeats_and_the_model_answers_the_rest(build, make_engine, bundled_model) -> None:  # type: ignore[no-untyped-def]
    """Against the uncached path: a repeat is served the model's own answer, a rewording (no evidence yet) gets the model."""
    engine = build(answer_cache=AnswerCacheConfig(max_error_rate=0.01))
    uncached = make_engine(bundled_model, system_prompt=SYSTEM)
    first = engine.chat("a", QUESTION, max_new_tokens=48)
    assert first.stats.finish_reason == "eos"
    again = engine.chat("b", "what is the capital of france", max_new_tokens=48)
    assert again.stats.answer_cache_hit and again.text == uncached.chat("x", QUESTION, max_new_tokens=48).text
    reworded = engine.chat("c", "Which city is the capital of France?", max_new_tokens=48)
    assert not reworded.stats.answer_cache_hit
    assert reworded.text == uncached.chat("y", "Which city is the capital of France?", max_new_tokens=48).text
    assert engine.answer_cache.snapshot().refused_without_evidence == 1


def test_a_follow_up_is_not_served_across_conversations(build) -> None:  # type: ignore[no-untyped-def]
    engine = build(answer_cache=AnswerCacheConfig(max_entropy_bits=100.0))  # store whatever finishes
    engine.chat("paris", "Tell me about Paris in one sentence.", max_new_tokens=48)
    before = engine.answer_cache.snapshot().stores
    paris = engine.chat("paris", "How many people live there?", max_new_tokens=48)
    assert paris.stats.finish_reason == "eos"
    # The Paris follow-up is in the cache: only its scope can keep it from Rome.
    assert engine.answer_cache.snapshot().stores == before + 1
    engine.chat("rome", "Tell me about Rome in one sentence.", max_new_tokens=48)
    follow_up = engine.chat("rome", "How many people live there?", max_new_tokens=48)
    assert not follow_up.stats.answer_cache_hit


def test_answers_never_cross_tenants(build) -> None:  # type: ignore[no-untyped-def]
    first = build(answer_cache=True, tenant="acme")
    first.chat("a", QUESTION, max_new_tokens=48)
    other = build(answer_cache=True, tenant="globex")
    assert not other.chat("b", QUESTION, max_new_tokens=48).stats.answer_cache_hit
    same = build(answer_cache=True, tenant="acme")  # a restart: entries come back from the database
    assert same.chat("c", QUESTION, max_new_tokens=48).stats.answer_cache_hit


def test_audit_mode_runs_the_model_and_records_agreement(build) -> None:  # type: ignore[no-untyped-def]
    engine = build(answer_cache=AnswerCacheConfig(audit_rate=1.0))
    engine.chat("a", QUESTION, max_new_tokens=48)
    hit = engine.chat("b", QUESTION, max_new_tokens=48)
    assert hit.stats.answer_cache_hit
    stats = engine.answer_cache.snapshot()
    assert stats.audits == 1 and stats.audit_agreements == 1


def test_wordings_of_a_confirmed_cacheable_intent_share_an_entry(make_engine, bundled_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(
        bundled_model,
        bot="customer_service",
        answer_cache=AnswerCacheConfig(max_entropy_bits=100.0),
        store=f"sqlite:///{tmp_path}/bank.db",
        token_tier=TokenTierConfig(spill_dir=None),
    )
    first = engine.chat("a", "What are your opening hours?", max_new_tokens=64)
    assert first.intent == "opening_hours" and first.stats.finish_reason == "eos"
    other_wording = engine.chat("b", "When does the branch open?", max_new_tokens=64)
    assert other_wording.intent == "opening_hours"
    assert other_wording.stats.answer_cache_hit and other_wording.text == first.text
    unrelated = engine.chat("c", "I lost my card", max_new_tokens=64)
    assert not unrelated.stats.answer_cache_hit  # another intent, another entry

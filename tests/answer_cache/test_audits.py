"""Audits: a served answer the model answered again is counted right or wrong, and too many wrong
answers found by meaning in one scope flag it as over its bound."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from scipy.stats import binomtest

from chatcache.answer_cache import AnswerCache, AnswerCacheConfig, Scope
from chatcache.answer_cache.audits import AuditLedger
from chatcache.answer_cache.bound import interval
from chatcache.storage import SessionStore

BOT = Scope("model@1", "bot-a")
OTHER = Scope("model@1", "bot-b")


def _now() -> datetime:
    return datetime(2026, 1, 1, tzinfo=timezone.utc)


def _ledger(max_error_rate: float | None = 0.1, confidence: float = 0.95) -> AuditLedger:
    return AuditLedger(max_error_rate, confidence, None, _now)


def test_a_scope_is_breached_once_its_wrong_answers_found_by_meaning_prove_it_and_not_before() -> None:
    """After 20 agreeing audits, wrong ones are added one by one: the scope is flagged from the
    first count at which an exact binomial test rejects "error rate <= 10%" at 5%, not earlier."""
    ledger = _ledger(max_error_rate=0.1)
    for _ in range(20):
        ledger.record(BOT.key(), 1, exact=False, similarity=0.9, agreed=True)
    flagged_at = None
    for wrong in range(1, 30):
        ledger.record(BOT.key(), 2, exact=False, similarity=0.8, agreed=False)
        proven = binomtest(wrong, 20 + wrong, 0.1, alternative="greater").pvalue < 0.05
        assert ledger.breached(BOT.key()) == proven, wrong
        if proven and flagged_at is None:
            flagged_at = wrong
    assert flagged_at is not None and flagged_at > 1, "one wrong answer among 21 proves nothing at 10%"
    assert not ledger.breached(OTHER.key()), "another scope's audits are its own"


def test_wrong_exact_repeats_and_an_unset_bound_never_breach() -> None:
    exact_only = _ledger(max_error_rate=0.1)
    unbound = _ledger(max_error_rate=None)
    for _ in range(50):
        exact_only.record(BOT.key(), 1, exact=True, similarity=1.0, agreed=False)
        unbound.record(BOT.key(), 2, exact=False, similarity=0.8, agreed=False)
    assert not exact_only.breached(BOT.key()), "an exact repeat is the same question: it says nothing of meaning"
    assert not unbound.breached(BOT.key())
    status = exact_only.status(0, 0)
    assert (status.audits, status.audit_errors, status.semantic_audits) == (50, 50, 0)


def test_the_status_gives_the_running_estimate_and_its_exact_interval() -> None:
    ledger = _ledger(max_error_rate=0.02, confidence=0.9)
    empty = ledger.status(0, 0)
    assert (empty.audits, empty.estimate, empty.interval) == (0, None, (0.0, 1.0))
    for index in range(40):
        ledger.record(BOT.key(), index, exact=index % 4 == 0, similarity=0.9, agreed=index % 10 != 3)
    status = ledger.status(scopes_by_meaning=2, scopes_exact_only=5)
    assert (status.max_error_rate, status.confidence) == (0.02, 0.9)
    assert (status.audits, status.audit_errors, status.estimate) == (40, 4, 0.1)
    assert status.interval == interval(4, 40, 0.9) and status.interval[0] < 0.1 < status.interval[1]
    assert (status.semantic_audits, status.semantic_audit_errors) == (30, 4)
    assert (status.scopes_by_meaning, status.scopes_exact_only) == (2, 5)


def test_record_audit_counts_the_hit_it_was_given(toy_embed) -> None:  # type: ignore[no-untyped-def]
    """The cache's own counters are this process's; the bound status tells exact from meaning.
    (No bound here: under one, a scope without calibration serves exact repeats only.)"""
    cache = AnswerCache(AnswerCacheConfig(similarity_threshold=0.7), toy_embed)
    cache.store("What are your opening hours?", "9 to 5", BOT, entropy_bits=1.0, latency_ms=300)
    exact = cache.lookup("what are your opening hours", BOT)
    near = cache.lookup("what are your opening hours today", BOT)
    assert exact is not None and exact.exact and near is not None and not near.exact
    assert exact.scope == near.scope == BOT.key()
    cache.record_audit(exact, agreed=True)
    cache.record_audit(near, agreed=False)
    stats = cache.snapshot()
    assert (stats.audits, stats.audit_agreements, stats.audit_errors) == (2, 1, 1)
    status = cache.bound_status()
    assert (status.audits, status.audit_errors, status.semantic_audits, status.semantic_audit_errors) == (2, 1, 1, 1)
    assert status.max_error_rate is None and status.estimate == 0.5


def test_audits_outlive_the_process_that_ran_them(toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/audits.db"
    with SessionStore(url) as store:
        cache = AnswerCache(AnswerCacheConfig(similarity_threshold=0.7), toy_embed, store.answers, audits=store.answer_audits)
        cache.store("What are your opening hours?", "9 to 5", BOT, entropy_bits=1.0, latency_ms=300)
        hit = cache.lookup("what are your opening hours today", BOT)
        assert hit is not None
        cache.record_audit(hit, agreed=False)
    with SessionStore(url) as store:
        restarted = AnswerCache(AnswerCacheConfig(), toy_embed, store.answers, audits=store.answer_audits)
        status = restarted.bound_status()
        assert (status.audits, status.audit_errors, status.semantic_audits) == (1, 1, 1)
        assert restarted.snapshot().audits == 0, "the counters are of this process's audits"
        [row] = store.answer_audits.added_after(0)
        assert (row.scope, row.entry_id, row.exact, row.agreed) == (BOT.key(), hit.entry_id, False, False)
        assert row.similarity == pytest.approx(hit.similarity)


def test_an_audit_whose_model_answers_otherwise_is_counted_wrong(tiny_model, make_engine, toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """audit_rate 1 on the tiny random model: the cache serves an answer the model would never
    write, the model is run anyway, disagrees, and the audit is counted wrong, stored, and seen
    by a second engine (another replica) on the same database."""
    from chatcache import TokenTierConfig

    def engine():  # type: ignore[no-untyped-def]
        return make_engine(
            tiny_model, system_prompt="You are a helpful assistant.", embedder=toy_embed,
            answer_cache=AnswerCacheConfig(audit_rate=1.0, max_error_rate=0.05),
            store=f"sqlite:///{tmp_path}/shared.db", token_tier=TokenTierConfig(spill_dir=None),
        )  # fmt: skip

    first = engine()
    question = "What is the capital of France?"
    first.sessions.create("a")
    where = first.turns.answer_scope("a", question)  # where session a's next turn looks it up
    assert where is not None and first.answer_cache.store(question, "Paris is the capital of France.", where.scope, 1.0, 100)
    reply = first.chat("a", question, max_new_tokens=8)
    assert reply.stats.answer_cache_hit and reply.text == "Paris is the capital of France."
    stats = first.answer_cache.snapshot()
    assert (stats.audits, stats.audit_agreements, stats.audit_errors) == (1, 0, 1)
    assert first.answer_cache.bound_status().audit_errors == 1
    replica = engine()
    status = replica.answer_cache.bound_status()
    assert (status.audits, status.audit_errors, status.max_error_rate) == (1, 1, 0.05)

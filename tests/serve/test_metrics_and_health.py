"""`/metrics` carries vLLM's names under `chatcache:` and our tiers'; `/health` and `/ready`."""

from __future__ import annotations

import re

import pytest

from prometheus_client.parser import text_string_to_metric_families

from chatcache.serving.server import WARM_UP_BATCHES, warm_up
from chatcache.model.kv import cached_length


def samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "le")
            if "le" not in sample.labels:
                found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def test_metrics_count_what_the_turns_did(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    with live.client() as http:
        before = samples(http.get("/metrics").text)
        replies = [
            http.post(
                "/v1/chat/completions",
                json={"model": live.model_id, "messages": [{"role": "user", "content": text}], "max_tokens": 5},
                headers={"X-Session-Id": "m"},
            ).json()
            for text in ("Hello there", "And again")
        ]
        after = samples(http.get("/metrics").text)
    generated = sum(r["usage"]["completion_tokens"] for r in replies)
    prompt = sum(r["usage"]["prompt_tokens"] for r in replies)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies)
    drafted = sum(r["chatcache"]["drafted_tokens"] for r in replies)
    accepted = sum(r["chatcache"]["accepted_tokens"] for r in replies)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("chatcache:generation_tokens_total") == generated
    assert grew("chatcache:spec_decode_num_draft_tokens_total") == drafted  # each reply says its own
    assert 0 <= grew("chatcache:spec_decode_num_accepted_tokens_total") == accepted <= drafted
    assert grew("chatcache:prompt_tokens_total") == prompt == grew("chatcache:prefix_cache_queries_total")
    assert grew("chatcache:prefix_cache_hits_total") == cached > 0
    assert grew("chatcache:time_to_first_token_seconds_count") == 2
    assert grew("chatcache:e2e_request_latency_seconds_count") == 2
    assert grew("chatcache:inter_token_latency_seconds_count") == generated - 2
    assert grew("chatcache:ttft_prediction_error_seconds_count") == 2
    assert grew('chatcache:turns_served_total{tier="session"}') == 1
    assert after["chatcache:num_requests_running"] == 0 and after["chatcache:num_requests_waiting"] == 0
    assert 0 < after["chatcache:kv_cache_usage_perc"] < 1
    for name in ("chatcache:kv_spills_total", "chatcache:kv_restores_total", "chatcache:answer_cache_lookups_total",
                 "chatcache:answer_cache_hits_total", "chatcache:drift_events_total", "chatcache:drift_resets_undone_total",
                 "chatcache:promotions_total"):  # fmt: skip
        assert name in after, name


def test_health_and_ready(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    with live.client() as http:
        assert http.get("/health").json() == {"status": "ok"}
        ready = http.get("/ready").json()
        assert ready["status"] == "ready" and ready["model"] == live.model_id
        live.app.state.server.tenants.store.close()  # a pool closed under it reopens: still ready
        assert http.get("/ready").status_code == 200
        assert re.search(r"chatcache:num_requests_running \d", http.get("/metrics").text)


def test_the_warm_up_measures_the_rates_and_leaves_nothing_behind(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=True, drift=True, ttft_slo=5.0)
    server = live.app.state.server
    scheduler = server.chat_model.scheduler
    rates = scheduler.rates
    assert rates.prefill_s_per_token is not None and {1, 16} <= rates.decode_step_s.keys()  # small and large batches
    engine = server.tenants("default")
    assert engine.answer_cache.stats.stores == 0 and engine.store.list_sessions() == []
    tier = server.tenants.token_tier
    prefix_bytes = len(engine.system_ids) * tier.bytes_per_token
    assert tier.stats().sessions_in_memory == 0 and tier.stats().resident_bytes == prefix_bytes, "only the shared prefix is kept"

    # Run again, watching what it hands the scheduler: every row starts from the system prompt's KV.
    started_from: list[int] = []
    submit = scheduler.submit

    def watched(cache, pending, *args):  # type: ignore[no-untyped-def]
        started_from.append(cached_length(cache))
        return submit(cache, pending, *args)

    monkeypatch.setattr(scheduler, "submit", watched)
    warm_up(server)
    assert started_from == [len(engine.system_ids)] * (1 + sum(WARM_UP_BATCHES))
    assert tier.stats().resident_bytes == prefix_bytes  # nothing held for a turn either: reservations count


def test_without_an_slo_the_warm_up_decodes_no_batches(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Only admission against a TTFT SLO reads the batch rates; without one the start is not delayed for them."""
    server = serve(answer_cache=True).app.state.server
    scheduler = server.chat_model.scheduler
    submitted: list[int] = []
    submit = scheduler.submit
    monkeypatch.setattr(scheduler, "submit", lambda cache, pending, *args: (submitted.append(len(pending)), submit(cache, pending, *args))[1])
    warm_up(server)
    assert len(submitted) == 1, "the engine's one short answer, no batch"


def test_a_serving_process_keeps_its_start_up_objects_out_of_the_collectors_scans(serve) -> None:  # type: ignore[no-untyped-def]
    """While a server runs, what start-up left (the model among it) is frozen, so a full collection
    under load does not walk it with the GIL held; once stopped, it is collectable again."""
    import gc

    live = serve()
    with live.client() as http:
        assert http.get("/ready").status_code == 200
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # torch, transformers, the model's modules and parameters
    live.stop()
    assert gc.get_freeze_count() == 0


def test_metrics_and_replies_show_the_answer_cache_bound_and_the_audits(serve) -> None:  # type: ignore[no-untyped-def]
    """With a bound and every hit audited: a cached answer the tiny model would never write is
    served, audited and counted wrong; the reply's `chatcache` field and the scrape both say so."""
    from chatcache.answer_cache.bound import interval

    live = serve(drift=False, answer_cache_max_error_rate=0.02, answer_cache_confidence=0.9, answer_cache_audit_rate=1.0)
    engine = live.app.state.server.tenants("default")
    question = "What is the capital of France?"
    body = {"model": live.model_id, "messages": [{"role": "user", "content": question}], "max_tokens": 6}
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "b1"}).raise_for_status()
        where = engine.turns.answer_scope("default/b1", question)  # where session b1's next turn looks it up
        assert where is not None and engine.answer_cache.store(question, "Paris is the capital of France.", where.scope, 1.0, 100)
        before = samples(http.get("/metrics").text)
        served = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "b1"}).json()["chatcache"]
        after = samples(http.get("/metrics").text)
    assert served["answer_cache_hit"] is True
    low, high = interval(1, 1, 0.9)
    assert served["answer_cache_bound"] == {
        "max_error_rate": 0.02, "confidence": 0.9, "audits": 1, "audit_errors": 1, "estimate": 1.0,
        "interval": [round(low, 4), round(high, 4)],
    }  # fmt: skip
    assert before["chatcache:answer_cache_audits_total"] == before["chatcache:answer_cache_audit_errors_total"] == 0
    assert before["chatcache:answer_cache_audit_error_rate"] != before["chatcache:answer_cache_audit_error_rate"]  # NaN: no audit yet
    assert after["chatcache:answer_cache_audits_total"] == after["chatcache:answer_cache_audit_errors_total"] == 1
    assert after["chatcache:answer_cache_max_error_rate"] == 0.02
    assert after["chatcache:answer_cache_audit_error_rate"] == 1.0
    assert (after["chatcache:answer_cache_audit_error_rate_lower"], after["chatcache:answer_cache_audit_error_rate_upper"]) == (low, high)
    assert after["chatcache:answer_cache_scopes_by_meaning"] >= 0 and after["chatcache:answer_cache_scopes_exact_only"] >= 0


def test_without_a_bound_neither_replies_nor_metrics_show_one(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(drift=False)
    body = {"model": live.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
    with live.client() as http:
        served = http.post("/v1/chat/completions", json=body).json()["chatcache"]
        scraped = samples(http.get("/metrics").text)
    assert "answer_cache_bound" not in served
    assert "chatcache:answer_cache_audits_total" in scraped and "chatcache:answer_cache_max_error_rate" not in scraped

"""Admission control: a predicted TTFT from the queue and measured rates; refused turns record nothing."""

from __future__ import annotations

import threading

import httpx
import pytest

from chatcache.model.scheduler import Scheduler, StepRates
from chatcache.serving.admission import AdmissionControl, Overloaded
from chatcache.answer_cache import Scope


@pytest.fixture
def scheduler(tiny_model):  # type: ignore[no-untyped-def]
    worker = Scheduler(tiny_model.model, prefill_chunk=512)
    worker.rates = StepRates(prefill_s_per_token=0.001, decode_step_s={1: 0.01})
    yield worker
    worker.close()


def test_the_prediction_counts_the_chunks_ahead_and_the_decode_steps_between_them(scheduler) -> None:  # type: ignore[no-untyped-def]
    control = AdmissionControl(scheduler, slo_s=None, max_queue=8)
    assert control.predict(100, ahead=[]) == pytest.approx(0.1)  # nothing decoding: the prefill alone
    # 500 + 1,000 tokens at 1 ms, in 1 + 2 chunks of 512, each step also decoding: 1.5 s + 3 x 10 ms.
    assert control.predict(1000, ahead=[500]) == pytest.approx(1.53)


def test_a_decode_step_is_read_off_the_line_through_the_nearest_measured_batch_sizes() -> None:
    rates = StepRates(decode_step_s={1: 0.1, 8: 0.3, 16: 0.7})
    assert rates.decode_step(8) == pytest.approx(0.3)
    assert rates.decode_step(4) == pytest.approx(0.1 + 3 * 0.2 / 7)
    assert rates.decode_step(12) == pytest.approx(0.5)
    assert rates.decode_step(32) == pytest.approx(1.5)  # beyond: the slope of the last two
    assert StepRates(decode_step_s={4: 0.2}).decode_step(16) == pytest.approx(0.2)
    assert StepRates().decode_step(3) == 0.0


def test_admitted_requests_queue_until_their_first_token_and_the_queue_and_slo_refuse(scheduler) -> None:  # type: ignore[no-untyped-def]
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=2)
    first, second, third = control.ticket(), control.ticket(), control.ticket()
    first.admit(400)
    assert first.predicted_s == pytest.approx(0.4) and control.waiting == 1
    second.admit(400)  # 0.8 s of prefill, one chunk of decode each: 0.82 s
    assert second.predicted_s == pytest.approx(0.82)
    with pytest.raises(Overloaded) as refused:
        third.admit(10)
    assert refused.value.reason == "queue" and refused.value.retry_after_s >= 1
    assert first.started(actual_ttft_s=0.5) == pytest.approx(0.1)  # actual - predicted
    assert control.waiting == 1
    with pytest.raises(Overloaded) as late:
        third.admit(800)  # 400 ahead + 800 = 1.2 s of prefill, over the 1 s SLO
    assert late.value.reason == "slo" and control.waiting == 1
    second.close()
    third.admit(800 - 100)
    assert control.waiting == 1


def test_a_restore_from_disk_adds_to_the_prediction_and_can_push_it_over_the_slo(scheduler) -> None:  # type: ignore[no-untyped-def]
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=8)
    resident, spilled, slow = control.ticket(), control.ticket(), control.ticket()
    resident.admit(100)
    assert resident.predicted_s == pytest.approx(0.1)
    resident.close()
    spilled.admit(100, restore_s=0.5)
    assert spilled.predicted_s == pytest.approx(0.6)
    spilled.close()
    with pytest.raises(Overloaded) as refused:
        slow.admit(100, restore_s=2.0)
    assert refused.value.reason == "slo"


def test_an_idle_model_lets_a_request_in_whatever_the_learned_overhead(scheduler) -> None:  # type: ignore[no-untyped-def]
    """After a slow spell the learned overhead alone predicts more than the SLO: refusing every
    request would keep it there for good, since only requests let in relearn it."""
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=8)
    control.overhead_s = 3.0
    alone = control.ticket()
    alone.admit(100)  # nothing ahead of it: let in at a prediction over the SLO
    assert alone.predicted_s == pytest.approx(3.1)
    with pytest.raises(Overloaded) as refused:
        control.ticket().admit(100)  # behind one: the prediction counts
    assert refused.value.reason == "slo"
    alone.started(actual_ttft_s=0.2)
    assert control.overhead_s < 3.0  # relearned from the one let in


def test_the_engines_own_time_is_learned_from_actual_first_tokens(scheduler) -> None:  # type: ignore[no-untyped-def]
    control = AdmissionControl(scheduler, slo_s=None, max_queue=8)
    for _ in range(30):
        ticket = control.ticket()
        ticket.admit(100)  # the rates predict 0.1 s; the first token keeps coming after 0.3 s
        ticket.started(0.3)
    ticket = control.ticket()
    ticket.admit(100)
    assert ticket.predicted_s == pytest.approx(0.3, abs=0.01)


def test_a_refused_turn_gets_429_with_retry_after_and_records_nothing(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(ttft_slo=1e-6, answer_cache=False, drift=False)  # every turn that needs the model is over it
    body = {"model": live.model_id, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
    with live.client() as http:
        refused = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "new"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "slo"
        assert int(refused.headers["retry-after"]) >= 1
        assert http.get("/v1/sessions/new").status_code == 404  # not even an empty session
        assert http.post("/v1/sessions", json={"id": "old"}).status_code == 201
        stream = http.post("/v1/sessions/old/messages", json={"content": "Hello", "stream": True})
        assert stream.status_code == 429  # refused before the stream starts
        assert http.get("/v1/sessions/old").json()["messages"] == []
        metrics = http.get("/metrics").text
    assert 'chatcache:rejections_total{reason="slo"} 2.0' in metrics


def test_a_message_too_long_to_start_in_time_is_refused_before_the_engine_runs(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The fast path counts the new message's own tokens: a turn that surely misses the SLO gets
    its 429 before the engine does any work, and a short one still goes on."""
    live = serve(ttft_slo=1.0, answer_cache=False, drift=False)
    server = live.app.state.server
    engine = server.tenants("default")
    started: list[str] = []
    stream = engine.stream
    monkeypatch.setattr(engine, "stream", lambda *a, **k: started.append("stream") or stream(*a, **k))
    measured = server.admission.scheduler.rates
    server.admission.scheduler.rates = StepRates(prefill_s_per_token=0.01, decode_step_s={1: 0.01})
    try:
        with live.client() as http:
            body = {"model": live.model_id, "messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 4}
            refused = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "s"})
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "slo"
            assert started == []  # 300 tokens at 10 ms: 3 s, over the 1 s SLO before the engine ran
            body["messages"][0]["content"] = "Hello"
            assert http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "s"}).status_code == 200
            assert started == ["stream"]
    finally:
        server.admission.scheduler.rates = measured


def test_the_queue_bound_refuses_under_real_concurrency(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(max_queue=1, answer_cache=False, drift=False)
    statuses: list[int] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(base_url=live.url, timeout=120) as http:
            body = {"model": live.model_id, "messages": [{"role": "user", "content": "Tell me a long story " * 20}], "max_tokens": 32}
            status = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": f"c{index}"}).status_code
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1
    with live.client() as http:
        kept = {s["id"] for s in http.get("/v1/sessions").json()["data"]}
    assert len(kept) == statuses.count(200)  # the refused ones left nothing


def fill_queue(live) -> None:  # type: ignore[no-untyped-def]
    """Admit tickets that never start: the model looks saturated to every new request."""
    admission = live.app.state.server.admission
    for _ in range(admission.max_queue):
        admission.ticket().admit(10)


def test_while_saturated_a_turn_that_needs_the_model_is_refused_before_the_engine_runs(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    live = serve(max_queue=2, answer_cache=True, drift=False)
    engine = live.app.state.server.tenants("default")
    started: list[str] = []
    stream = engine.stream
    monkeypatch.setattr(engine, "stream", lambda *a, **k: started.append("stream") or stream(*a, **k))
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "s"})
        fill_queue(live)
        refused = http.post("/v1/sessions/s/messages", json={"content": "What are your opening hours?"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue"
        assert started == [] and http.get("/v1/sessions/s").json()["messages"] == []
        # An exact repeat of a cached question may be served: it goes on to the engine.
        scope = engine.turns.answer_scope("default/s", "What are your opening hours?")
        engine.answer_cache.store("What are your opening hours?", "Nine to five.", scope.scope, entropy_bits=0.1, latency_ms=100, embedding=None)
        served = http.post("/v1/sessions/s/messages", json={"content": "What are your opening hours?"})
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"] == "Nine to five." and started == ["stream"]
        as_json = {"content": "What are your opening hours?", "response_format": {"type": "json_object"}}
        assert http.post("/v1/sessions/s/messages", json=as_json).status_code == 429  # the stored answer is free text
        assert started == ["stream"]  # refused before the engine ran
        paraphrase = http.post("/v1/sessions/s/messages", json={"content": "When do you open?"})
        assert paraphrase.status_code == 429  # telling a paraphrase from a miss would take the embedder's time


def test_while_saturated_the_door_tells_no_user_what_another_asked(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A question cached in another user's scope is refused like one nobody asked, at the door
    (not later, after the engine's work), whether the asking session is in memory or not."""
    live = serve(max_queue=2, answer_cache=True, drift=False)
    engine = live.app.state.server.tenants("default")
    started: list[str] = []
    stream = engine.stream
    monkeypatch.setattr(engine, "stream", lambda *a, **k: started.append("stream") or stream(*a, **k))
    asked = "Is my card blocked?"
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "b"})
        engine.answer_cache.store(asked, "Yes, since Monday.", Scope("other-user", "bot"), entropy_bits=0.1, latency_ms=100, embedding=None)
        assert engine.answer_cache.knows(asked)
        fill_queue(live)
        for in_memory in (False, True):
            if in_memory:
                engine.sessions.open("default/b", create=False)
            else:
                engine.sessions.forget("default/b")
            replies = [http.post("/v1/sessions/b/messages", json={"content": text}) for text in (asked, "Something nobody asked")]
            assert [(r.status_code, r.json()["error"]["code"]) for r in replies] == [(429, "queue")] * 2, in_memory
    assert started == []


@pytest.mark.bundled
def test_an_answer_cache_hit_is_served_while_the_model_is_saturated(serve, bundled_model) -> None:  # type: ignore[no-untyped-def]
    live = serve(chat_model=bundled_model, answer_cache=True, drift=False,
                 system_prompt="You are a concise assistant. Answer in one short sentence.")  # fmt: skip
    body = {"model": live.model_id, "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 48}
    with live.client() as http:
        first = http.post("/v1/chat/completions", json=body).json()
        assert first["choices"][0]["finish_reason"] == "stop"
        fill_queue(live)
        other = {**body, "messages": [{"role": "user", "content": "Name a large river."}]}
        assert http.post("/v1/chat/completions", json=other).status_code == 429
        again = http.post("/v1/chat/completions", json=body)
        assert again.status_code == 200 and again.json()["chatcache"]["answer_cache_hit"] is True
        assert again.json()["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]



def test_each_api_key_has_its_own_request_rate(serve, keys_file) -> None:  # type: ignore[no-untyped-def]
    from .conftest import KEY_A, KEY_B

    live = serve(api_key_file=keys_file, rate_limit=0.01, rate_burst=2, answer_cache=False, drift=False)
    with live.client(KEY_A) as a, live.client(KEY_B) as b:
        assert [a.get("/v1/sessions").status_code for _ in range(3)] == [200, 200, 429]
        limited = a.get("/v1/sessions")
        assert limited.json()["error"]["code"] == "rate" and int(limited.headers["retry-after"]) >= 1
        assert b.get("/v1/sessions").status_code == 200


def test_with_an_slo_a_turn_that_would_wait_for_kv_memory_is_refused(scheduler) -> None:  # type: ignore[no-untyped-def]
    with_slo = AdmissionControl(scheduler, slo_s=5.0, max_queue=8)
    with pytest.raises(Overloaded) as refused:
        with_slo.ticket().admit(10, fits_in_memory=False)
    assert refused.value.reason == "memory" and with_slo.waiting == 0
    without = AdmissionControl(scheduler, slo_s=None, max_queue=8)
    without.ticket().admit(10, fits_in_memory=False)  # no promise to keep: it waits its turn
    assert without.waiting == 1


def test_at_the_door_a_request_is_judged_on_the_fewest_tokens_it_prefills(scheduler) -> None:  # type: ignore[no-untyped-def]
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=8)
    refusal = control.ticket().hold(least_prefill_tokens=2000)  # 2 s of prefill at 1 ms a token
    assert refusal is not None and refusal.reason == "slo" and control.waiting == 0
    assert control.ticket().hold(least_prefill_tokens=900) is None and control.waiting == 1


def test_a_request_let_in_at_the_door_keeps_its_place_until_the_engine_knows_its_prefill(scheduler) -> None:  # type: ignore[no-untyped-def]
    """A burst: each request let in counts for the next, so the last of the burst is refused at
    the door, not by the engine after its work before the model."""
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=8)
    first, second, third = control.ticket(), control.ticket(), control.ticket()
    assert first.hold(400) is None and second.hold(400) is None and control.waiting == 2
    refusal = third.hold(400)  # 1.2 s of prefill with the two ahead
    assert refusal is not None and refusal.reason == "slo" and control.waiting == 2 and not third.waiting
    first.admit(200)  # its prefill known: judged again, its place now counted at 200 tokens
    assert first.predicted_s == pytest.approx(0.6 + 2 * 0.01) and control.waiting == 2
    assert third.hold(100) is None and control.waiting == 3  # 700 tokens and three chunks: 0.73 s
    assert second.started(actual_ttft_s=0.05) is None  # served without the model: no prediction to learn from
    assert control.waiting == 2 and control.overhead_s == 0.0
    with pytest.raises(Overloaded) as late:
        third.admit(900)  # 200 ahead + 900: over the SLO once its prefill is known
    assert late.value.reason == "slo" and control.waiting == 1 and not third.waiting


def test_at_the_door_the_kv_of_the_turns_let_in_and_a_restore_count(scheduler) -> None:  # type: ignore[no-untyped-def]
    room = [2000]  # KV tokens that would get their memory now
    control = AdmissionControl(scheduler, slo_s=1.0, max_queue=8, memory_room=lambda tokens: tokens <= room[0])
    first, second = control.ticket(), control.ticket()
    assert first.hold(10, kv_tokens=1000) is None and second.hold(10, kv_tokens=900) is None
    refusal = control.ticket().hold(10, kv_tokens=200)  # 1,900 tokens let in at the door, and its own 200
    assert refusal is not None and refusal.reason == "memory"
    first.admit(10)  # the engine reserved its KV in the token tier: the door no longer counts it
    assert control.ticket().hold(10, kv_tokens=200) is None
    slow = control.ticket().hold(10, restore_s=1.5)  # its session's KV comes back from disk first
    assert slow is not None and slow.reason == "slo"
    assert AdmissionControl(scheduler, slo_s=None, max_queue=8, memory_room=lambda tokens: False).ticket().hold() is None

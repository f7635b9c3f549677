"""The sessions API, and what API keys keep apart: sessions, KV and answers never cross tenants."""

from __future__ import annotations

import pytest

from .conftest import KEY_A, KEY_B


def test_a_session_lives_through_the_sessions_api(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False)
    with live.client() as http:
        created = http.post("/v1/sessions", json={"id": "order-42", "title": "Order"})
        assert created.status_code == 201 and created.json()["id"] == "order-42"
        assert http.post("/v1/sessions", json={"id": "order-42"}).status_code == 409
        turn = http.post("/v1/sessions/order-42/messages", json={"content": "Where is my order?", "max_tokens": 6})
        assert turn.status_code == 200
        reply = turn.json()["choices"][0]["message"]["content"]
        streamed = http.post("/v1/sessions/order-42/messages", json={"content": "Thanks", "max_tokens": 6, "stream": True})
        assert streamed.text.rstrip().endswith("data: [DONE]")
        listed = http.get("/v1/sessions").json()["data"]
        assert [s["id"] for s in listed] == ["order-42"] and listed[0]["handed_off"] is False
        detail = http.get("/v1/sessions/order-42").json()
        assert [(m["role"], m["content"]) for m in detail["messages"][:2]] == [("user", "Where is my order?"), ("assistant", reply)]
        assert len(detail["messages"]) == 4 and detail["status"] == "active"
        ended = http.delete("/v1/sessions/order-42")
        assert ended.status_code == 200 and ended.json()["status"] == "ended"
        refused = http.post("/v1/sessions/order-42/messages", json={"content": "Hello?"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_ended"
        assert len(http.get("/v1/sessions/order-42").json()["messages"]) == 4  # nothing recorded


def test_without_a_valid_key_nothing_is_served(serve, keys_file) -> None:  # type: ignore[no-untyped-def]
    live = serve(api_key_file=keys_file, answer_cache=False, drift=False)
    with live.client() as anonymous, live.client("key-nobody-has-0123456749") as wrong:
        for http in (anonymous, wrong):
            for method, path, body in (
                ("GET", "/v1/models", None),
                ("GET", "/v1/sessions", None),
                ("POST", "/v1/sessions", {}),
                ("POST", "/v1/chat/completions", {"model": live.model_id, "messages": [{"role": "user", "content": "hi"}]}),
            ):
                response = http.request(method, path, json=body)
                assert response.status_code == 401, (method, path)
                assert response.headers["www-authenticate"] == "Bearer"
    with live.client(KEY_A) as http:
        assert http.get("/v1/models").status_code == 200


def test_tenants_never_see_each_others_sessions_even_with_the_same_id(serve, keys_file) -> None:  # type: ignore[no-untyped-def]
    live = serve(api_key_file=keys_file, answer_cache=False, drift=False)
    with live.client(KEY_A) as a, live.client(KEY_B) as b:
        body = {"model": live.model_id, "messages": [{"role": "user", "content": "My account number is 12345674"}], "max_tokens": 4}
        assert a.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "shared"}).status_code == 200
        assert b.get("/v1/sessions/shared").status_code == 404
        assert b.get("/v1/sessions").json()["data"] == []
        assert b.post("/v1/sessions/shared/messages", json={"content": "What is my account number?"}).status_code == 404
        assert b.delete("/v1/sessions/shared").status_code == 404
        other = {"model": live.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        answered = b.post("/v1/chat/completions", json=other, headers={"X-Session-Id": "shared"})
        assert answered.status_code == 200
        assert answered.json()["usage"]["prompt_tokens"] < 60  # B's own new conversation: A's turn is not in it
        mine = a.get("/v1/sessions/shared").json()["messages"]
        theirs = b.get("/v1/sessions/shared").json()["messages"]
        assert mine[0]["content"] == "My account number is 12345674"
        assert theirs[0]["content"] == "Hello" and len(theirs) == 2


@pytest.mark.bundled
def test_answers_never_cross_tenants_over_http(serve, keys_file, bundled_model) -> None:  # type: ignore[no-untyped-def]
    live = serve(chat_model=bundled_model, api_key_file=keys_file, answer_cache=True, drift=False,
                 system_prompt="You are a concise assistant. Answer in one short sentence.")  # fmt: skip
    body = {"model": live.model_id, "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 48}
    with live.client(KEY_A) as a, live.client(KEY_B) as b:
        first = a.post("/v1/chat/completions", json=body).json()
        assert first["choices"][0]["finish_reason"] == "stop"
        assert a.post("/v1/chat/completions", json=body).json()["chatcache"]["answer_cache_hit"] is True
        other = b.post("/v1/chat/completions", json=body).json()
        assert other["chatcache"]["answer_cache_hit"] is False and other["chatcache"]["tier"] != "answer"
        assert b.post("/v1/chat/completions", json=body).json()["chatcache"]["answer_cache_hit"] is True  # its own entry


@pytest.mark.bundled
def test_one_users_answer_never_reaches_another_after_the_same_small_talk(serve, bundled_model) -> None:  # type: ignore[no-untyped-def]
    """Ada and Bob, in one tenant, each give their name, then say the same thing, then ask the
    same question. Bob's reply must be exactly the one a server without an answer cache gives
    him: the answer cache may serve him only what does not depend on Ada's conversation."""
    settings = {"chat_model": bundled_model, "drift": True, "system_prompt": "You are a concise assistant. Answer in one short sentence."}
    script = ["Nice to meet you. The weather is lovely today.", "What is my name?"]

    def converse(live, session: str, name: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
        with live.client() as http:
            http.post("/v1/sessions", json={"id": session}).raise_for_status()
            turns = [f"Hello, my name is {name}.", *script]
            return [http.post(f"/v1/sessions/{session}/messages", json={"content": text, "max_tokens": 24}).json() for text in turns]

    cached = serve(answer_cache=True, **settings)
    ada = converse(cached, "ada", "Ada")
    bob = converse(cached, "bob", "Bob")
    uncached = converse(serve(answer_cache=False, **settings), "bob", "Bob")
    replies = [[turn["choices"][0]["message"]["content"] for turn in turns] for turns in (ada, bob, uncached)]
    assert replies[0][-1] != replies[2][-1], "the last answer depends on who asks (else this test could not fail)"
    assert replies[1] == replies[2], "Bob got what he would have got with no answer cache"


def test_a_handed_off_session_is_listed_as_such(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False)
    with live.client() as http:
        for session_id, text in (("human", "I want to talk to a human"), ("hours", "Hello there")):
            http.post("/v1/sessions", json={"id": session_id})
            assert http.post(f"/v1/sessions/{session_id}/messages", json={"content": text, "max_tokens": 4}).status_code == 200
        handed = http.get("/v1/sessions", params={"handed_off": "true"}).json()["data"]
        assert [s["id"] for s in handed] == ["human"] and handed[0]["dialogue_state"] == "HANDED_OFF"
        assert [s["id"] for s in http.get("/v1/sessions", params={"handed_off": "false"}).json()["data"]] == ["hours"]
        assert http.get("/v1/sessions/human").json()["handed_off"] is True

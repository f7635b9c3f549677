"""Bad input gets a clear 4xx in OpenAI's error shape, never a 500, and nothing is lost."""

from __future__ import annotations

import threading

import pytest


@pytest.fixture
def live(serve):  # type: ignore[no-untyped-def]
    return serve(answer_cache=False, drift=False, max_body_bytes=20_000)


def chat(live, content: object = "Hello", **fields: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"model": live.model_id, "messages": [{"role": "user", "content": content}], **fields}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "M", "messages": []}, "messages"),
        ({"model": "M", "messages": [{"role": "tool", "content": "hi"}]}, "role"),
        ({"model": "M", "messages": [{"role": "user"}]}, "content"),
        ({"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"model": "M", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"model": "M", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tool"),
        ({"model": "M", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "M", "messages": [{"role": "assistant", "content": "hi"}]}, "user"),
        ({"model": "M", "messages": [{"role": "user", "content": "nul \u0000 here"}]}, "NUL"),
        ({"model": "M", "messages": [{"role": "user", "content": "   "}]}, "empty"),
    ],
)
def test_a_malformed_request_is_a_400_that_names_the_problem(live, body: dict[str, object], needle: str) -> None:  # type: ignore[no-untyped-def]
    if body.get("model") == "M":
        body["model"] = live.model_id
    with live.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert needle.lower() in error["message"].lower() and error["type"] == "invalid_request_error"


def test_not_json_and_an_unknown_model_are_4xx(live) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        assert http.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
        unknown = http.post("/v1/chat/completions", json={**chat(live), "model": "gpt-4o"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_an_oversized_body_is_413_and_nothing_is_recorded(live) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "s"})
        response = http.post("/v1/sessions/s/messages", json={"content": "x" * 50_000})
        assert response.status_code == 413
        assert http.get("/v1/sessions/s").json()["messages"] == []


def test_a_message_over_the_context_window_says_how_many_tokens_and_keeps_the_session(live) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        assert http.post("/v1/chat/completions", json=chat(live, "Hello", max_tokens=4), headers={"X-Session-Id": "s"}).status_code == 200
        before = http.get("/v1/sessions/s").json()["messages"]
        long = " ".join(["word"] * 600)  # the tiny model's window is 512 tokens
        response = http.post("/v1/chat/completions", json=chat(live, long), headers={"X-Session-Id": "s"})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and "tokens" in error["message"]
        assert http.get("/v1/sessions/s").json()["messages"] == before
        stateless = http.post("/v1/chat/completions", json=chat(live, long, stream=True))
        assert stateless.status_code == 400 and stateless.json()["error"]["code"] == "context_length_exceeded"


def test_with_a_session_id_only_the_new_user_message_is_taken(live) -> None:  # type: ignore[no-untyped-def]
    body = {"model": live.model_id, "messages": [{"role": "system", "content": "Obey me"}, {"role": "user", "content": "hi"}]}
    with live.client() as http:
        response = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "s"})
        assert response.status_code == 400 and "only the new user message" in response.json()["error"]["message"]
        assert http.get("/v1/sessions/s").status_code == 404


@pytest.mark.parametrize("session_id", ["x" * 91, "tab\there"])
def test_a_bad_session_id_is_a_400(live, session_id: str) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        assert http.post("/v1/chat/completions", json=chat(live), headers={"X-Session-Id": session_id}).status_code == 400
        assert http.post("/v1/sessions", json={"id": session_id}).status_code in (400,)


def test_an_unknown_session_is_a_404(live) -> None:  # type: ignore[no-untyped-def]
    with live.client() as http:
        for method, path, body in (
            ("GET", "/v1/sessions/nope", None),
            ("POST", "/v1/sessions/nope/messages", {"content": "hi"}),
            ("DELETE", "/v1/sessions/nope", None),
        ):
            response = http.request(method, path, json=body)
            assert response.status_code == 404 and response.json()["error"]["code"] == "session_not_found"


@pytest.mark.parametrize("policy", ["wait", "reject"])
def test_a_second_message_while_a_turn_runs_waits_or_is_409_and_turns_never_interleave(serve, policy: str) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache=False, drift=False, busy_session=policy)
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "s"})
    statuses: list[int] = []
    barrier = threading.Barrier(4)

    def send(index: int) -> None:
        with live.client() as http:
            barrier.wait()
            response = http.post("/v1/sessions/s/messages", json={"content": f"message {index}", "max_tokens": 24})
            statuses.append(response.status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with live.client() as http:
        messages = http.get("/v1/sessions/s").json()["messages"]
    answered = statuses.count(200)
    if policy == "wait":
        assert statuses == [200] * 4
    else:
        assert answered >= 1 and set(statuses) <= {200, 409} and 409 in statuses
    assert [m["role"] for m in messages] == ["user", "assistant"] * answered  # each reply right after its question

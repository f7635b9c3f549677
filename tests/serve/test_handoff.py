"""Handoff is a real state: the bot announces it and falls silent, a person answers through the
API with a summary to start from, and hands the session back."""

from __future__ import annotations

from chatcache.dialog.manager import HANDOFF_REPLY


def turn(http, session_id: str, text: str) -> dict:  # type: ignore[no-untyped-def]
    response = http.post(f"/v1/sessions/{session_id}/messages", json={"content": text, "max_tokens": 6})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_handed_off_session_waits_for_a_person_who_answers_and_hands_it_back(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False)
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "c"})
        turn(http, "c", "What are your opening hours on Saturday?")
        handed = turn(http, "c", "I want to talk to a human")
        assert handed["choices"][0]["message"]["content"] == HANDOFF_REPLY
        assert handed["chatcache"]["handed_off"] is True and handed["chatcache"]["generated_tokens"] == 0
        waiting = turn(http, "c", "My card was stolen yesterday")
        assert waiting["choices"][0]["message"]["content"] == "" and waiting["chatcache"]["tier"] == "agent"
        detail = http.get("/v1/sessions/c").json()
        assert detail["handed_off"] is True and detail["messages"][-1] == {"role": "user", "content": "My card was stolen yesterday"}
        summary = detail["handoff_summary"]
        assert "talk to human" in summary and "- My card was stolen yesterday" in summary
        answered = http.post("/v1/sessions/c/agent", json={"content": "I have blocked your card.", "agent": "sam"})
        assert answered.status_code == 201
        last = http.get("/v1/sessions/c").json()["messages"][-1]
        assert (last["role"], last["content"], last["agent"], last["served"]["tier"]) == ("assistant", "I have blocked your card.", "sam", "agent")
        assert turn(http, "c", "Thank you!")["choices"][0]["message"]["content"] == ""  # still with the person
        assert http.get("/v1/sessions/c").json()["claimed_by"] == "sam"  # replying claimed it
        back = http.post("/v1/sessions/c/hand-back", json={"agent": "sam"})
        assert back.status_code == 200 and back.json()["handed_off"] is False and back.json()["claimed_by"] is None
        bot_again = turn(http, "c", "What are your opening hours on Sunday?")
        assert bot_again["chatcache"]["tier"] not in ("agent",) and bot_again["chatcache"]["handed_off"] is False
        roles = [(m["role"], m.get("agent")) for m in http.get("/v1/sessions/c").json()["messages"]]
    assert roles == [
        ("user", None), ("assistant", None), ("user", None), ("assistant", None),
        ("user", None), ("assistant", "sam"), ("user", None), ("user", None), ("assistant", None),
    ]  # fmt: skip


def test_only_a_handed_off_session_takes_a_persons_reply(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False)
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "c"})
        turn(http, "c", "Hello there")
        refused = http.post("/v1/sessions/c/agent", json={"content": "Hi, Sam here", "agent": "sam"})
        assert refused.status_code == 400 and "not handed off" in refused.json()["error"]["message"]
        assert http.post("/v1/sessions/c/hand-back", json={"agent": "sam"}).status_code == 400
        assert http.post("/v1/sessions/c/claim", json={"agent": "sam"}).status_code == 400
        assert http.post("/v1/sessions/nope/agent", json={"content": "Hi", "agent": "sam"}).status_code == 404
        assert len(http.get("/v1/sessions/c").json()["messages"]) == 2

"""The server's turn response says which action ran and whether the session is handed off."""

from __future__ import annotations

ASK = "Send 200 dollars to account 12345674"


def test_the_server_says_which_action_ran(serve, write_bank_bot) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot=str(write_bank_bot()), answer_cache=False, drift=False)
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "s"})
        first = http.post("/v1/sessions/s/messages", json={"content": ASK}).json()["chatcache"]
        assert first["action"] is None and first["handed_off"] is False and first["dialogue_state"] == "CONFIRMING"
        done = http.post("/v1/sessions/s/messages", json={"content": "yes"}).json()
    assert done["choices"][0]["message"]["content"] == "Sent 200 to 12345674, reference T-1."
    action = done["chatcache"]["action"]
    assert action["name"] == "transfer" and action["arguments"] == {"amount": "200", "to_account": "12345674"}
    assert action["result"] == {"reference": "T-1"} and action["cached"] is False

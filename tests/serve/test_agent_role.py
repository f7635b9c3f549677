"""Agents and customers: a key's role decides who may take a handed-off conversation over, an
agent's key decides under which name, and of two agents only one has it at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache.serving.app import PAGE_POLICY
from .conftest import KEY_A, KEY_B

AGENT_A = "key-agent-a-0123456789"  # sam's
AGENT_A_KIM = "key-agent-a-kim-0123456789"
AGENT_B = "key-agent-b-0123456789"


@pytest.fixture
def keys_with_agents(tmp_path: Path) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(f"{KEY_A} tenant-a\n{AGENT_A} tenant-a agent sam\n{AGENT_A_KIM} tenant-a agent kim\n{KEY_B} tenant-b customer\n{AGENT_B} tenant-b agent lee\n")
    return path


def hand_off(http, session_id: str) -> None:  # type: ignore[no-untyped-def]
    http.post("/v1/sessions", json={"id": session_id}).raise_for_status()
    for text in ("My card was stolen", "I want to talk to a human"):
        http.post(f"/v1/sessions/{session_id}/messages", json={"content": text, "max_tokens": 4}).raise_for_status()
    assert http.get(f"/v1/sessions/{session_id}").json()["handed_off"] is True


AGENT_CALLS = [
    ("GET", "/v1/agent/queue", None),
    ("POST", "/v1/sessions/c/claim", {}),
    ("POST", "/v1/sessions/c/agent", {"content": "Hello, Sam here."}),
    ("POST", "/v1/sessions/c/hand-back", {}),
]


def test_a_customers_key_gets_403_from_every_agent_endpoint(serve, keys_with_agents: Path) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False, api_key_file=keys_with_agents)
    with live.client(KEY_A) as customer, live.client(AGENT_A) as agent:
        hand_off(customer, "c")
        for method, path, body in AGENT_CALLS:
            refused = customer.request(method, path, json=body)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "agent_role_required"
        assert customer.get("/v1/sessions/c").json()["claimed_by"] is None  # nothing was done
        assert agent.get("/v1/agent/queue").status_code == 200
    with live.client() as nobody:
        assert all(nobody.request(m, p, json=b).status_code == 401 for m, p, b in AGENT_CALLS)


def test_the_second_agent_to_claim_is_told_who_has_it_and_cannot_answer_or_hand_back(serve, keys_with_agents: Path) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False, api_key_file=keys_with_agents)
    with live.client(KEY_A) as customer, live.client(AGENT_A) as sam, live.client(AGENT_A_KIM) as kim:
        hand_off(customer, "c")
        taken = sam.post("/v1/sessions/c/claim", json={})
        assert taken.status_code == 200 and taken.json()["claimed_by"] == "sam"  # the key's person
        for path, body in (("claim", {}), ("agent", {"content": "Kim here"}), ("hand-back", {})):
            refused = kim.post(f"/v1/sessions/c/{path}", json=body)
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_claimed", path
            assert refused.json()["error"]["message"] == "sam has already taken over this conversation."
        assert sam.post("/v1/sessions/c/agent", json={"content": "Sam here"}).status_code == 201
        assert [m.get("agent") for m in customer.get("/v1/sessions/c").json()["messages"]][-1] == "sam"
        back = sam.post("/v1/sessions/c/hand-back", json={"agent": "sam"})  # naming oneself is allowed
        assert back.status_code == 200 and back.json()["claimed_by"] is None and back.json()["handed_off"] is False


def test_an_agents_key_acts_under_its_own_name_only(serve, keys_with_agents: Path) -> None:  # type: ignore[no-untyped-def]
    """Holding kim's key and saying "sam" takes nothing over: the claim would let kim answer as
    sam, and customers read the name beside the reply."""
    live = serve(bot="customer_service", answer_cache=False, drift=False, api_key_file=keys_with_agents)
    with live.client(KEY_A) as customer, live.client(AGENT_A) as sam, live.client(AGENT_A_KIM) as kim:
        hand_off(customer, "c")
        assert sam.get("/v1/agent/queue").json()["agent"] == "sam"
        for path, body in (("claim", {"agent": "sam"}), ("agent", {"agent": "sam", "content": "Sam here"})):
            refused = kim.post(f"/v1/sessions/c/{path}", json=body)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "agent_name_mismatch", path
        record = customer.get("/v1/sessions/c").json()
        assert record["claimed_by"] is None and [m.get("agent") for m in record["messages"]] == [None] * 4


def test_on_an_open_server_the_agent_says_who_they_are(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False)
    with live.client() as http:
        hand_off(http, "c")
        assert http.get("/v1/agent/queue").json()["agent"] is None
        unnamed = http.post("/v1/sessions/c/claim", json={})
        assert unnamed.status_code == 400 and unnamed.json()["error"]["code"] == "agent_name_required"
        assert http.post("/v1/sessions/c/claim", json={"agent": "sam"}).json()["claimed_by"] == "sam"


def test_the_queue_lists_the_tenants_handed_off_sessions_newest_first_with_summaries(serve, keys_with_agents: Path) -> None:  # type: ignore[no-untyped-def]
    live = serve(bot="customer_service", answer_cache=False, drift=False, api_key_file=keys_with_agents)
    with live.client(KEY_A) as customer, live.client(AGENT_A) as agent, live.client(KEY_B) as other, live.client(AGENT_B) as other_agent:
        hand_off(customer, "first")
        customer.post("/v1/sessions", json={"id": "bot-only"}).raise_for_status()
        customer.post("/v1/sessions/bot-only/messages", json={"content": "Hello", "max_tokens": 4}).raise_for_status()
        hand_off(customer, "second")
        hand_off(other, "elsewhere")
        queue = agent.get("/v1/agent/queue").json()["data"]
        assert [row["id"] for row in queue] == ["second", "first"]
        assert all("talk to human" in row["handoff_summary"] and row["claimed_by"] is None for row in queue)
        assert queue[0]["title"] == "My card was stolen"  # titled by its first message
        assert [row["id"] for row in other_agent.get("/v1/agent/queue").json()["data"]] == ["elsewhere"]


def test_key_lines_take_an_optional_role_and_refuse_an_unknown_one(tmp_path: Path) -> None:
    from chatcache.serving import ServeSettings
    from chatcache.serving.keys import KeyFileError

    keys = ServeSettings(api_keys=f"{KEY_A} acme;{AGENT_A} acme agent sam;{KEY_B} acme customer").keys()
    callers = [(c.tenant, c.role, c.name) for c in map(keys.caller_of, (KEY_A, AGENT_A, KEY_B))]
    assert callers == [("acme", "customer", None), ("acme", "agent", "sam"), ("acme", "customer", None)]
    refusals = {
        f"{KEY_A} acme admin": "line 1: role 'admin' must be one of customer, agent",
        f"{AGENT_A} acme agent": "line 1: an agent's key names its person",
        f"{KEY_A} acme customer sam": "line 1: a name is given to an agent's key only",
        f"{AGENT_A} acme agent <b>sam</b>": "line 1: a name is given to an agent's key only",
    }
    path = tmp_path / "keys.txt"
    for line, message in refusals.items():
        path.write_text(line + "\n")
        with pytest.raises(KeyFileError, match=message):
            ServeSettings(api_key_file=path).keys()


def test_the_pages_forbid_inline_script_and_other_origins(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve()
    with live.client() as http:
        for page in ("/", "/agent"):
            response = http.get(page)
            assert response.status_code == 200 and response.headers["content-security-policy"] == PAGE_POLICY
            assert "<script>" not in response.text  # every script is a file the policy allows
        assert http.get("/static/chat.js").headers["content-type"].startswith("text/javascript")
        assert http.get("/static/..%2Fapp.py").status_code == 404 and http.get("/static/secret.txt").status_code == 404


def test_a_session_can_be_renamed_and_the_title_cleared(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve()
    with live.client() as http:
        http.post("/v1/sessions", json={"id": "s"}).raise_for_status()
        http.post("/v1/sessions/s/messages", json={"content": "What is a  cache?", "max_tokens": 2}).raise_for_status()
        assert http.get("/v1/sessions/s").json()["title"] == "What is a cache?"
        assert http.patch("/v1/sessions/s", json={"title": "Caches"}).json()["title"] == "Caches"
        assert http.patch("/v1/sessions/s", json={"title": None}).json()["title"] is None
        assert http.patch("/v1/sessions/s", json={"title": "x" * 201}).status_code == 400
        assert http.patch("/v1/sessions/nope", json={"title": "x"}).status_code == 404

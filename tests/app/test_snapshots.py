"""The look, pinned as SVG snapshots (update with `pytest tests/app --snapshot-update`).

Deterministic by construction: the conversation is seeded into the session tier with fixed
text and timings, so no model output or clock reaches the screen.
"""

from __future__ import annotations

import pytest

REPLY = """Here is what I can do:

- answer questions
- keep **context** across turns

```python
engine.chat("s1", "hi")
```"""


@pytest.fixture
def seeded_app(engine, make_app, seed_session):  # type: ignore[no-untyped-def]
    seed_session(engine, "groceries", [("What should I buy?", "Bread, milk and eggs.")], title="Groceries")
    seed_session(engine, "welcome", [("Hello! What can you do?", REPLY)], ttft_ms=42.0)
    return make_app(engine, session_id="welcome")


@pytest.fixture
def flow_app(engine, make_app):  # type: ignore[no-untyped-def]
    """A customer-service turn answered by the bot's flow (tier "dialog"), with a long session id."""
    store, user = engine.store, engine.sessions.user_id
    session = "chat-1201-0845"
    store.get_or_create_session(session, user, engine.sessions.bot)
    store.append_message(session, "user", "I want to transfer 200 dollars", 7)
    meta = {"tier": "dialog", "finish_reason": "flow", "ttft_s": 0.114, "intent": "transfer_money",
            "dialogue_state": "COLLECTING_SLOTS"}
    store.append_message(session, "assistant", "What is the 8-digit number of the account it should go to?", 14, meta)
    return make_app(engine, new_session_id=lambda: "chat-1201-0912")


def test_chat_at_80x24(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """80x24: the sessions sidebar, the conversation with Markdown rendered, every footer key up to Help; no cache panel."""
    assert snap_compare(seeded_app, terminal_size=(80, 24))


def test_new_start_at_80x24(flow_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """A start opens a new conversation: "(new) chat-1201-0912" on one line above the earlier session."""
    assert snap_compare(flow_app, terminal_size=(80, 24))


def test_cache_panel_on_a_flow_turn_at_80x24(flow_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """F4 at 80x24, on a turn the bot's flow answered: "served by bot's flow", every line unwrapped."""

    async def open_flow_turn(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.app.open_session("chat-1201-0845")
        await pilot.press("f4")

    assert snap_compare(flow_app, run_before=open_flow_turn, terminal_size=(80, 24))


def test_chat_with_cache_panel_at_120x34(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """120x34: the cache panel on the right shows the last turn (tier session, TTFT 42 ms), memory and the legend."""
    assert snap_compare(seeded_app, terminal_size=(120, 34))


def test_help_screen(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """F1 shows the keys table over the chat, Rename and Delete included."""
    assert snap_compare(seeded_app, press=["f1"], terminal_size=(80, 24))

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
    return make_app(engine)


def test_chat_at_80x24(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """80x24: the sessions sidebar, the conversation with Markdown rendered, the footer keys; no cache panel."""
    assert snap_compare(seeded_app, terminal_size=(80, 24))


def test_chat_with_cache_panel_at_120x34(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """120x34: the cache panel on the right shows the last turn (tier session, TTFT 42 ms) and memory."""
    assert snap_compare(seeded_app, terminal_size=(120, 34))


def test_help_screen(seeded_app, snap_compare) -> None:  # type: ignore[no-untyped-def]
    """F1 shows the keys table over the chat."""
    assert snap_compare(seeded_app, press=["f1"], terminal_size=(80, 24))

"""The cache panel: the answer-cache bound (what the cache promises and what its audits
measured), and a drafted turn's drafted tokens."""

from __future__ import annotations

import pytest

from chatcache.apps.tui.turns import TurnRecord
from chatcache.apps.tui.widgets.cache_panel import describe_bound, describe_turn
from chatcache.answer_cache import BoundStatus
from chatcache.answer_cache.bound import interval

pytestmark = pytest.mark.anyio
QUESTION = "What is the capital of France?"


def _status(errors: int, audits: int, by_meaning: int, max_error_rate: float | None = 0.01) -> BoundStatus:
    return BoundStatus(
        max_error_rate, 0.95, audits, errors, errors / audits if audits else None, interval(errors, audits, 0.95),
        errors, audits, by_meaning, 3,
    )  # fmt: skip


def test_the_bound_reads_as_a_promise_and_the_audits_as_a_measurement() -> None:
    assert describe_bound(_status(3, 400, by_meaning=2)) == [
        "wrong     ≤ 1.0%, 95% sure",
        "scopes    2 by meaning",
        "audits    3/400 wrong",
        "          0.8% [0.2–2.2%]",
    ]
    assert describe_bound(_status(0, 0, by_meaning=0)) == ["wrong     ≤ 1.0%, 95% sure", "exact repeats only", "audits    none yet"]
    assert describe_bound(_status(1, 1, by_meaning=0))[-1] == "          100% [2.5–100%]"
    assert describe_bound(None) == [] and describe_bound(_status(0, 0, 0, max_error_rate=None)) == []


@pytest.mark.parametrize(("errors", "audits"), [(0, 0), (1, 1), (3, 400), (57, 9999), (0, 10000)])
def test_every_bound_line_fits_the_panels_26_columns(errors: int, audits: int) -> None:
    for line in describe_bound(_status(errors, audits, by_meaning=12, max_error_rate=0.005)):
        assert len(line) <= 26, line


def test_a_drafted_turn_shows_how_many_drafted_tokens_the_model_kept() -> None:
    drafted = TurnRecord(tier="session", ttft_s=0.2, reused_tokens=900, prefilled_tokens=12, drafted_tokens=1040, accepted_tokens=136)
    lines = describe_turn(drafted, 3).splitlines()
    assert "drafted   136/1040 kept" in lines
    assert all(len(line) <= 26 for line in lines)
    undrafted = TurnRecord(tier="session", ttft_s=0.2, reused_tokens=900, prefilled_tokens=12, drafted_tokens=0, accepted_tokens=0)
    assert "drafted" not in describe_turn(undrafted, 3)  # drafting off: the panel looks as it did


async def test_the_panel_shows_the_bound_then_the_audit_of_a_served_answer(tiny_model, make_engine, make_app, settle, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """A bound of 1% with no scope certified: "exact repeats only" and no audit yet. Asking a
    question the cache holds (an answer the tiny model would never write), audited: "audits 1/1 wrong"."""
    from chatcache import AnswerCacheConfig, TokenTierConfig

    engine = make_engine(
        tiny_model, system_prompt="You are a helpful assistant.", embedder=toy_embed,
        answer_cache=AnswerCacheConfig(max_error_rate=0.01, audit_rate=1.0), token_tier=TokenTierConfig(spill_dir=None),
    )  # fmt: skip
    engine.sessions.create("chat")
    where = engine.turns.answer_scope("chat", QUESTION)  # where the session's next turn looks it up
    assert where is not None and engine.answer_cache.store(QUESTION, "Paris is the capital of France.", where.scope, 1.0, 100)
    app = make_app(engine, session_id="chat")
    async with app.run_test(size=(120, 34)) as pilot:
        memory = str(app.query_one("#memory").render())
        assert "wrong     ≤ 1.0%, 95% sure\nexact repeats only\naudits    none yet" in memory
        await pilot.press(*QUESTION, "enter")
        await settle(pilot)
        memory = str(app.query_one("#memory").render())
        assert "hit rate  100% (1/1)" in memory
        assert "audits    1/1 wrong\n          100% [2.5–100%]" in memory
    engine.close()

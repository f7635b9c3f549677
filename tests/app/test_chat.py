"""The conversation: sending, streaming into the log, the input history, cancelling, errors, scrolling."""

from __future__ import annotations

import asyncio

import pytest

from chatcache.apps.tui.widgets import ChatLog, PromptInput
from chatcache import ReplyStream

pytestmark = pytest.mark.anyio


def panel_text(app, widget_id: str) -> str:  # type: ignore[no-untyped-def]
    return str(app.query_one(f"#{widget_id}").render())


async def test_sending_streams_the_reply_into_the_log_and_fills_the_cache_panel(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """Typing "hello" and Enter shows "you: hello", then the bot's reply, and the panel shows how it was served."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        messages = app.query_one(ChatLog).messages
        assert [m.role for m in messages] == ["user", "assistant"]
        assert messages[0].text == "hello"
        assert messages[1].text  # the reply streamed in
        assert app.query_one(PromptInput).value == ""
        turn = panel_text(app, "turn-stats")
        assert "tier      prefix" in turn  # a new session starts from the shared system prompt
        assert "reused    28 tok" in turn and "prefilled" in turn and "TTFT" in turn and " ms" in turn
        assert "served by model" in turn
        assert "sessions  1 in memory" in panel_text(app, "memory")
        assert "hit rate  0% (0/1)" in panel_text(app, "memory")

        await pilot.press(*"and then", "enter")
        await settle(pilot)
        assert "tier      session" in panel_text(app, "turn-stats")  # the second turn reuses the session's KV
        assert len(app.query_one("#ttft").data) == 2  # one sparkline bar per turn


async def test_reply_text_is_the_engines_reply(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """The bot's message shows exactly the text the engine recorded (control characters removed)."""
    from chatcache.apps.tui.widgets.message import printable

    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        shown = app.query_one(ChatLog).messages[1].text
        assert shown == printable(engine.sessions.history("s-1")[-1].content)
        assert shown


async def test_up_and_down_walk_the_input_history(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """Up brings back the last sent message, Up again the one before; Down returns to what was being typed."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        for text in ("first", "second"):
            await pilot.press(*text, "enter")
            await settle(pilot)
        prompt = app.query_one(PromptInput)
        await pilot.press(*"draft")
        await pilot.press("up")
        assert prompt.value == "second"
        await pilot.press("up")
        assert prompt.value == "first"
        await pilot.press("up")
        assert prompt.value == "first"  # the oldest stays
        await pilot.press("down")
        assert prompt.value == "second"
        await pilot.press("down")
        assert prompt.value == "draft"


async def test_escape_cancels_the_reply_and_keeps_the_users_message(engine, make_app, settle, slow_replies) -> None:  # type: ignore[no-untyped-def]
    """Esc during a reply stops it: the message and the partial reply stay, marked "cancelled"."""
    restore = slow_replies(engine, delay=0.05)
    app = make_app(engine, max_new_tokens=200)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        log = app.query_one(ChatLog)
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len(log.messages) == 2 and log.messages[1].text:
                break
        assert app.generating
        await pilot.press("escape")
        await settle(pilot)
        assert not app.generating
        user, bot = log.messages
        assert user.text == "hello" and bot.border_subtitle == "cancelled"
        records = engine.sessions.records("s-1")
        assert [r.role for r in records] == ["user", "assistant"] and records[0].content == "hello"
        assert records[1].meta["finish_reason"] == "cancelled"
        assert "finish    cancelled" in panel_text(app, "turn-stats")
        # the app is usable again: the next message goes through
        restore()
        await pilot.press(*"again", "enter")
        await settle(pilot)
        assert [m.text for m in log.messages][2] == "again"


async def test_empty_input_is_a_notice_not_a_message(engine, make_app, settle, notices) -> None:  # type: ignore[no-untyped-def]
    """Enter on an empty input shows a warning notice and sends nothing."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        seen = notices(app)
        await pilot.press("space", "enter")
        await settle(pilot)
        assert app.query_one(ChatLog).messages == []
        assert seen == [("The message is empty: type something to send.", "warning")]


async def test_an_engine_error_is_a_notice_and_the_app_keeps_running(engine, make_app, settle, notices) -> None:  # type: ignore[no-untyped-def]
    """When the model fails mid-reply, an error notice appears, the reply is marked failed, and chat goes on."""
    real = engine.stream

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        def pieces():  # type: ignore[no-untyped-def]
            yield "partial "
            raise RuntimeError("the model ran out of memory")

        return ReplyStream(pieces())

    engine.stream = broken
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        seen = notices(app)
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        assert ("the model ran out of memory", "error") in seen
        bot = app.query_one(ChatLog).messages[1]
        assert bot.has_class("-failed") and bot.border_subtitle == "failed"
        assert app.is_running and not app.generating
        engine.stream = real
        await pilot.press(*"again", "enter")
        await settle(pilot)
        assert len(app.query_one(ChatLog).messages) == 4


async def test_log_follows_new_text_only_when_at_the_bottom(engine, make_app, settle, seed_session) -> None:  # type: ignore[no-untyped-def]
    """At the bottom the log scrolls with the reply; scrolled up to read, it stays where the reader is."""
    seed_session(engine, "long", [(f"question {i}", "line\n\n" * 6) for i in range(8)])
    app = make_app(engine, session_id="long")
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.query_one(ChatLog)
        await pilot.pause()
        assert log.max_scroll_y > 0 and log.is_vertical_scroll_end
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        assert log.is_vertical_scroll_end  # followed the new messages

        log.scroll_home(animate=False)
        await pilot.pause()
        before = log.max_scroll_y
        await pilot.press(*"more", "enter")
        await settle(pilot)
        assert log.max_scroll_y > before  # the log grew ...
        assert log.scroll_y == 0  # ... but the reader was not pulled down


async def test_drift_and_dialogue_are_shown_in_the_panel(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """A turn flagged as a topic change shows "turn 1: topic changed"; state and intent show with confidence."""
    from chatcache import Reply, TurnStats

    def scripted(session_id, text, **kwargs):  # type: ignore[no-untyped-def]
        stats = TurnStats(tier="prefix", drift=True, answer_cache_hit=True, ttft_s=0.02)
        reply = Reply(session_id, "Sure.", [], stats, intent="book_table", confidence=0.87, dialogue_state="COLLECTING")

        def turn():  # type: ignore[no-untyped-def]
            yield "Sure."
            return reply

        return ReplyStream(turn())

    engine.stream = scripted
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"book a table", "enter")
        await settle(pilot)
        dialogue = panel_text(app, "dialogue")
        assert "state     COLLECTING" in dialogue and "intent    book_table\n          confidence 0.87" in dialogue
        assert "turn 1: topic changed" in dialogue
        assert "served by answer cache" in panel_text(app, "turn-stats")
        assert "hit rate  100% (1/1)" in panel_text(app, "memory")

"""The sessions sidebar: new, rename, delete, resume, order by last activity, and a restart."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from chatcache.apps.tui.screens import ConfirmScreen, RenameScreen
from chatcache.apps.tui.widgets import ChatLog, ChatMessage, SessionList
from chatcache import TokenTierConfig

pytestmark = pytest.mark.anyio


async def test_new_sessions_are_listed_most_recent_first_and_resume_on_select(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """Ctrl+N starts "(new) s-2" at the top; choosing s-1 in the sidebar brings its messages back and moves it up."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        sidebar = app.query_one(SessionList)
        await pilot.press(*"one", "enter")
        await settle(pilot)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.session_id == "s-2" and app.query_one(ChatLog).messages == []
        assert sidebar.session_ids == ["s-2", "s-1"]
        assert str(sidebar.get_option_at_index(0).prompt) == "(new) s-2"
        await pilot.press(*"two", "enter")
        await settle(pilot)
        assert sidebar.session_ids == ["s-2", "s-1"]

        sidebar.focus()
        sidebar.highlighted = 1
        await pilot.press("enter")
        await pilot.pause()
        assert app.session_id == "s-1"
        assert [m.text for m in app.query_one(ChatLog).messages][0] == "one"
        app.query_one("#prompt").focus()
        await pilot.press(*"three", "enter")
        await settle(pilot)
        assert sidebar.session_ids == ["s-1", "s-2"]  # most recent activity first
        assert sidebar.highlighted == 0


async def test_rename_shows_the_title_in_the_sidebar(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """F2, a title and Enter: the sidebar and the header show "Trip plans" instead of the
    session's first message, and the header its id only until it has a first message."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.sub_title.startswith("s-1 · bot:")
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        assert app.sub_title.startswith("hello · bot:")
        await pilot.press("f2")
        await pilot.pause()
        assert isinstance(app.screen, RenameScreen)
        await pilot.press(*"Trip plans", "enter")
        await pilot.pause()
        assert str(app.query_one(SessionList).get_option_at_index(0).prompt) == "Trip plans"
        assert app.sub_title.startswith("Trip plans · bot:")
        assert engine.sessions.get("s-1").title == "Trip plans"


async def test_delete_asks_then_removes_the_session_and_its_history(engine, make_app, settle, seed_session) -> None:  # type: ignore[no-untyped-def]
    """F8 asks "Delete session ...?"; "n" keeps it, "y" removes it and opens the next most recent one."""
    seed_session(engine, "older", [("hi", "hello")])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"doomed", "enter")
        await settle(pilot)
        await pilot.press("f8")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert [s.id for s in engine.sessions.all()] == ["s-1", "older"]
        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert [s.id for s in engine.sessions.all()] == ["older"]
        assert app.query_one(SessionList).session_ids == ["older"]
        assert app.session_id == "older" and app.query_one(ChatLog).messages[0].text == "hi"


async def test_a_restarted_app_lists_every_session_with_history_and_reuses_cached_context(  # type: ignore[no-untyped-def]
    tiny_model, make_engine, make_app, settle, tmp_path
) -> None:
    """Quit and start again on the same database: a new conversation opens, both earlier sessions
    are listed; picking the latest brings its messages back and its next turn is served from the
    KV spilled to disk ("tier disk")."""
    url = f"sqlite:///{tmp_path}/restart.db"
    kv = TokenTierConfig(spill_dir=tmp_path / "kv")
    first = make_engine(tiny_model, system_prompt="You are a helpful assistant.", store=url, token_tier=kv)
    app = make_app(first)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"alpha", "enter")
        await settle(pilot)
        await pilot.press("ctrl+n", *"beta", "enter")
        await settle(pilot)
    first.close()

    second = make_engine(tiny_model, system_prompt="You are a helpful assistant.", store=url, token_tier=kv)
    app = make_app(second)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        sidebar = app.query_one(SessionList)
        assert sidebar.session_ids == ["s-1-2", "s-2", "s-1"]  # s-1 is taken: the new one is s-1-2
        assert app.pending and app.query_one(ChatLog).messages == []
        sidebar.focus()
        sidebar.highlighted = 1
        await pilot.press("enter")
        await pilot.pause()
        assert app.session_id == "s-2"
        assert [m.role for m in app.query_one(ChatLog).messages] == ["user", "assistant"]
        assert app.query_one(ChatLog).messages[0].text == "beta"
        assert len(app.query_one("#ttft").data) == 1  # the earlier turn's TTFT, from the record
        app.query_one("#prompt").focus()
        await pilot.press(*"gamma", "enter")
        await settle(pilot)
        assert "tier      disk" in str(app.query_one("#turn-stats").render())
    second.close()


async def test_a_title_too_long_to_store_is_refused_with_a_notice(engine, make_app, settle, notices) -> None:  # type: ignore[no-untyped-def]
    """A 201-character title: a warning that names the limit, and the session keeps its old name
    (its first message, "hello")."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        seen = notices(app)
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        await pilot.press("f2")
        await pilot.pause()
        field = app.focused
        assert isinstance(field, Input)
        await pilot.press("t")
        field.value += "t" * 200  # the rest pasted: 201 key presses took 14 s of the suite
        await pilot.press("enter")
        await pilot.pause()
        assert seen == [("session title is 201 characters long, over the limit of 200; nothing was written", "warning")]
        assert engine.sessions.get("s-1").title == "hello"
        assert str(app.query_one(SessionList).get_option_at_index(0).prompt) == "hello"


async def test_a_new_start_does_not_open_another_process_s_half_finished_session(  # type: ignore[no-untyped-def]
    engine, make_app, seed_session
) -> None:
    """The most recent session is mid-conversation (another window's, say): a new start opens an
    empty "(new) s-1" and only lists the other one; --session opens it as asked."""
    seed_session(engine, "other-window", [("I want to transfer money", "How much?")])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.session_id == "s-1" and app.pending
        assert app.query_one(ChatLog).messages == []
        assert app.query_one(SessionList).session_ids == ["s-1", "other-window"]
    app = make_app(engine, session_id="other-window")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.session_id == "other-window" and app.query_one(ChatLog).messages[0].text == "I want to transfer money"


async def test_sessions_of_scripts_stay_out_of_the_app(tiny_model, make_engine, make_app, notices) -> None:  # type: ignore[no-untyped-def]
    """The app's engine is user "app": a session made by `chatcache ask` or a script (user "local")
    is not listed, and asking for it by id opens a new conversation with a notice on how to continue it."""
    from chatcache.apps.tui import APP_USER

    engine = make_engine(tiny_model, system_prompt="You are a helpful assistant.", user_id=APP_USER,
                         token_tier=TokenTierConfig(spill_dir=None))
    engine.store.get_or_create_session("script-1", "local", "default")
    engine.store.append_message("script-1", "user", "from a script", 3)
    app = make_app(engine, session_id="script-1")
    seen = notices(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.session_id == "s-1"
        assert app.query_one(SessionList).session_ids == ["s-1"]
        assert any("chatcache chat --session script-1 --user local" in message for message, _ in seen)
    engine.close()


async def test_a_handed_off_session_is_marked_and_its_silent_turns_say_why(tiny_model, make_engine, make_app, settle, notices, toy_embed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The handoff queue at a glance: "[agent]" leads the label of a session a person has taken
    over, named by its first message, and a message the bot no longer answers says it waits for
    that person."""
    bot = tmp_path / "desk.yaml"
    bot.write_text(
        "system_prompt: You are a help desk.\n"
        "intents:\n  - name: talk_to_human\n    examples: ['I want to talk to a human']\n"
        "flows:\n  talk_to_human:\n    hand_off: true\n    response: Putting you through to a colleague.\n"
    )
    engine = make_engine(tiny_model, bot=bot, embedder=toy_embed, token_tier=TokenTierConfig(spill_dir=None))
    app = make_app(engine)
    seen = notices(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"I want to talk to a human", "enter")
        await settle(pilot)
        sidebar = app.query_one(SessionList)
        assert str(sidebar.get_option_at_index(0).prompt) == "[agent] I want to talk to a human"
        await pilot.press(*"hello?", "enter")
        await settle(pilot)
        replies = [m for m in app.query(ChatMessage) if m.role == "assistant"]
        assert replies[-2].text == "Putting you through to a colleague." and replies[-2].border_subtitle == "handed to a person"
        assert replies[-1].text == "" and replies[-1].border_subtitle == "no bot reply: waiting for a person"
        assert any("A person from the team has this conversation now" in message for message, _ in seen)

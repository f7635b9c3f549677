"""The command palette's commands and the layout keys: export, clear caches, switch bot, panel, help."""

from __future__ import annotations

import json

import pytest

from chatcache.apps.tui.screens import AskScreen, HelpScreen
from chatcache.apps.tui.widgets import CachePanel, SessionList
from chatcache import TokenTierConfig

pytestmark = pytest.mark.anyio


async def run_command(pilot, name: str) -> None:  # type: ignore[no-untyped-def]
    """Open the palette with Ctrl+P, type the command's name and run it."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*name)
    await pilot.pause(0.3)  # the palette searches in the background
    await pilot.press("enter")
    await pilot.pause()


async def test_export_writes_markdown_and_json(engine, make_app, settle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """"Export session" asks for a directory and writes s-1.md and s-1.json with the conversation."""
    app = make_app(engine)
    target = tmp_path / "exports"
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        await run_command(pilot, "Export session")
        assert isinstance(app.screen, AskScreen)
        app.screen.query_one("#answer").value = str(target)
        await pilot.press("enter")
        await pilot.pause()
    markdown = (target / "s-1.md").read_text()
    assert markdown.startswith("# hello\n") and "Session `s-1`" in markdown and "**You:**\n\nhello" in markdown  # titled by its first message
    data = json.loads((target / "s-1.json").read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][0]["content"] == "hello" and data["messages"][1]["meta"]["tier"] == "prefix"
    assert "token_ids" not in data["messages"][1]["meta"]


async def test_export_defaults_to_the_documents_folder_and_says_where(  # type: ignore[no-untyped-def]
    engine, make_app, settle, notices, tmp_path, monkeypatch
) -> None:
    """Enter on the proposed directory writes into ~/Documents/chatcache, not the working
    directory, and the notice names the folder."""
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOCUMENTS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    app = make_app(engine)
    seen = notices(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()
        assert app.screen.query_one("#answer").value == str(home / "Documents" / "chatcache")
        await pilot.press("enter")
        await pilot.pause()
    assert (home / "Documents" / "chatcache" / "s-1.md").is_file()
    assert not (tmp_path / "s-1.md").exists()
    assert (f"Wrote s-1.md and s-1.json to {home / 'Documents' / 'chatcache'}", "information") in seen


def test_without_a_documents_folder_exports_go_to_the_data_dir(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No ~/Documents (a server, a container): exports go under the data directory."""
    from chatcache.apps.tui.export import default_export_dir

    monkeypatch.setenv("HOME", str(tmp_path / "bare-home"))
    monkeypatch.delenv("XDG_DOCUMENTS_DIR", raising=False)
    monkeypatch.setenv("CHATCACHE_DATA_DIR", str(tmp_path / "data"))
    assert default_export_dir() == tmp_path / "data" / "exports"


async def test_clear_caches_empties_the_kv_tier(engine, make_app, settle) -> None:  # type: ignore[no-untyped-def]
    """"Clear caches" frees the KV: the panel shows 0 sessions in memory and the next turn reuses only the system prompt ("tier prefix")."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"hello", "enter")
        await settle(pilot)
        assert engine.kv_stats().resident_bytes > 0
        await run_command(pilot, "Clear caches")
        assert engine.kv_stats().resident_bytes == 0
        assert "sessions  0 in memory" in str(app.query_one("#memory").render())
        await pilot.press(*"again", "enter")
        await settle(pilot)
        # the session's KV is gone: only the shared system prompt is reused, the rest is prefilled again
        assert "tier      prefix" in str(app.query_one("#turn-stats").render())


async def test_switch_bot_uses_the_engine_factory(tiny_model, make_engine, make_app, settle, toy_embed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """"Switch bot" then "customer_service": the header names the bot and the panel shows its dialogue state and intent."""
    url = f"sqlite:///{tmp_path}/bots.db"
    kv = TokenTierConfig(spill_dir=None)

    def factory(bot):  # type: ignore[no-untyped-def]
        system = None if bot else "You are a helpful assistant."
        return make_engine(tiny_model, system_prompt=system, bot=bot, embedder=toy_embed, store=url, token_tier=kv)

    app = make_app(factory(None), engine_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        await run_command(pilot, "Switch bot")
        await pilot.press(*"customer_service", "enter")
        await settle(pilot)
        assert app.engine.sessions.bot == "customer_service"
        assert "bot: customer_service" in app.sub_title
        await pilot.press(*"I want to transfer 200 dollars to account 12345674", "enter")
        await settle(pilot)
        dialogue = str(app.query_one("#dialogue").render())
        assert "state     CONFIRMING" in dialogue and "intent    transfer_money\n          confidence " in dialogue
        turn = str(app.query_one("#turn-stats").render())
        assert "tier      dialog" in turn and "served by bot's flow" in turn  # the model did not answer
    app.engine.close()


async def test_f4_toggles_the_cache_panel(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """At 100 columns the panel shows and F4 hides it; at 80 columns it starts hidden and F4 shows it."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.query_one(CachePanel)
        assert panel.display
        await pilot.press("f4")
        assert not panel.display
        await pilot.press("f4")
        assert panel.display
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(CachePanel)
        assert not panel.display and app.query_one(SessionList).display
        await pilot.press("f4")
        await pilot.pause()
        assert panel.display and panel.region.width > 0


async def test_f3_toggles_the_sessions_sidebar(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """F3 hides the sessions sidebar and shows it again."""
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        sidebar = app.query_one(SessionList)
        await pilot.press("f3")
        assert not sidebar.display
        await pilot.press("f3")
        assert sidebar.display


async def test_help_screen_lists_the_keys(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """F1 opens a table of keys (Esc, Ctrl+N, F2, ...), also those the footer leaves out; Esc closes it."""
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = dict(app.screen.keys)
        assert keys["esc"] == "Cancel the reply being generated" and keys["^n"] == "Start a new conversation"
        assert keys["f4"] == "Show or hide the cache panel" and keys["f1 ?"] == "List every key"
        assert keys["f2"].startswith("Give the open session a title") and keys["f8"] == "Delete the open session"
        assert keys["Up / Down"].startswith("Previous")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_at_80x24_the_footer_shows_every_key_up_to_help(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """At 80 columns the footer fits: Cancel, New, Export, Sessions, Cache (F4) and Help (F1) are all on screen."""
    from textual.widgets._footer import FooterKey

    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        shown = {key.key_display: key.region for key in app.screen.query(FooterKey)}
        assert {"esc", "^n", "f5", "f3", "f4", "f1"} <= set(shown)
        assert all(region.width > 0 and region.right <= 80 for region in shown.values())


async def test_palette_offers_every_app_command(engine, make_app) -> None:  # type: ignore[no-untyped-def]
    """The command palette lists new, export, clear caches, switch bot and toggle panel."""
    app = make_app(engine)
    async with app.run_test(size=(100, 30)):
        titles = {command.title for command in app.get_system_commands(app.screen)}
    assert {"New session", "Export session", "Clear caches", "Switch bot", "Toggle cache panel"} <= titles

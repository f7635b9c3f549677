"""The terminal chat app: sessions on the left, the conversation in the middle, the cache on the right.

A turn runs in a thread worker: it reads the engine's `ReplyStream` and hands each piece to the
UI with `call_from_thread`. Esc sets an event the worker checks after each piece; the worker then
closes the stream, which keeps what was generated (the user's message was recorded before the
model ran). Engine errors become notices, never a crash. The app does not decode, cache or store
anything itself: the engine and its session tier are the record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Union

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, OptionList

from chatcache import ChatEngine, Reply, ReplyStream, StorageError
from chatcache.dialog import State, shipped_bots
from chatcache.storage import ChatSession

from .export import default_export_dir, export_session
from .screens import AskScreen, ConfirmScreen, HelpScreen, RenameScreen
from .turns import TurnRecord
from .widgets import CachePanel, ChatLog, ChatMessage, PromptInput, SessionList

FLUSH_S = 0.05  # the longest a streamed piece waits before it is shown

EngineFactory = Callable[[Union[str, None]], ChatEngine]

# The user id of the app's sessions (`chatcache chat` passes it to its engines): sessions made
# by `chatcache ask` and scripts belong to another user and stay out of the sidebar.
APP_USER = "app"


def default_session_id() -> str:
    # Short enough for the 80-column sidebar; a second new session in the same minute gets "-2".
    return datetime.now().strftime("chat-%m%d-%H%M")


class ChatApp(App[int]):
    """Chat with a `ChatEngine`; see `run_tui`."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "chatcache"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    # The footer shows what fits in 80 columns; F1 (help) and Ctrl+P list every key and command.
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel the reply being generated"),
        Binding("ctrl+n", "new_session", "New", tooltip="Start a new conversation"),
        Binding("f2", "rename_session", "Rename", show=False, tooltip="Give the open session a title"),
        Binding("f8", "delete_session", "Delete", show=False, tooltip="Delete the open session"),
        Binding("f5", "export_session", "Export", tooltip="Write the session as Markdown and JSON"),
        Binding("f3", "toggle_sidebar", "Sessions", tooltip="Show or hide the sessions sidebar"),
        Binding("f4", "toggle_panel", "Cache", tooltip="Show or hide the cache panel"),
        Binding("f1,question_mark", "help", "Help", key_display="f1", tooltip="List every key"),
    ]

    def __init__(
        self,
        engine: ChatEngine,
        engine_factory: EngineFactory | None = None,
        session_id: str | None = None,
        bot: str | None = None,
        max_new_tokens: int = 256,
        new_session_id: Callable[[], str] = default_session_id,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.engine_factory = engine_factory
        self.bot = bot
        self.max_new_tokens = max_new_tokens
        self.new_session_id = new_session_id
        self.session_id = session_id or ""
        self.pending = False  # the open session has no record in the session tier yet
        self.turns: list[TurnRecord] = []  # the open session's turns, for the cache panel
        self.answered = self.answer_hits = 0  # every turn of this run, for the answer-cache hit rate
        self.generating = False
        self._cancel = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield SessionList(id="sessions")
            with Vertical(id="conversation"):
                yield ChatLog(id="log")
                yield PromptInput(placeholder="Message: Enter sends, Up/Down history, Esc cancels", id="prompt")
            yield CachePanel(id="panel")
        yield Footer()

    async def on_mount(self) -> None:
        # A new conversation unless one was asked for: the latest session may be another
        # process's, halfway through a flow. The sidebar lists the earlier ones to pick from.
        requested = self.session_id if self.session_id and self._continuable(self.session_id) else ""
        await self.open_session(requested or self._fresh_id())
        self.query_one(PromptInput).focus()

    def _continuable(self, session_id: str) -> bool:
        """Whether this engine may add turns to `session_id`; if not, say how to continue it."""
        try:
            session = self.engine.sessions.get(session_id)
        except KeyError:  # UnknownSessionError: a new session of that name
            return True
        if self.engine.sessions.is_mine(session):
            return True
        self.notify(
            f"Session {session_id} belongs to user {session.user_id!r} and bot {session.bot!r}; "
            f"to continue it: chatcache chat --session {session_id} --user {session.user_id}"
            + ("" if session.bot == "default" else f" --bot {session.bot}"),
            title="Opened a new conversation instead",
            severity="warning",
            timeout=15,
        )
        return False

    # -- sessions -----------------------------------------------------------------------

    def _sessions(self) -> list[ChatSession]:
        """The session tier's sessions of the current bot (others cannot be continued here)."""
        bot = self.engine.sessions.bot
        return [s for s in self.engine.sessions.all() if s.bot == bot]

    def _latest_session(self) -> str | None:
        sessions = self._sessions()
        return sessions[0].id if sessions else None

    def _fresh_id(self) -> str:
        """A session id no one has used, whichever user or bot its session belongs to."""
        candidate = base = self.new_session_id()
        suffix = 1
        while self._exists(candidate):
            suffix += 1
            candidate = f"{base}-{suffix}"
        return candidate

    def _exists(self, session_id: str) -> bool:
        try:
            self.engine.sessions.get(session_id)
        except KeyError:  # UnknownSessionError
            return False
        return True

    def refresh_sessions(self) -> None:
        sessions = self._sessions()
        handed_off = {s.id for s in sessions if self.engine.sessions.dialogue_state(s) == State.HANDED_OFF}
        self.query_one(SessionList).show(sessions, self.session_id, self.pending, handed_off)

    async def open_session(self, session_id: str) -> None:
        """Show `session_id`'s record (all messages, also unanswered ones) and its turns' figures."""
        self.session_id = session_id
        try:
            records = self.engine.sessions.records(session_id)
            self.pending = False
        except KeyError:  # UnknownSessionError: created by its first message
            records, self.pending = [], True
        self.turns = [TurnRecord.from_meta(r.meta) for r in records if r.role == "assistant"]
        await self.query_one(ChatLog).show([(r.role.value, r.content) for r in records])
        self.query_one(PromptInput).set_history([r.content for r in records if r.role == "user"])
        self.show_header()
        self.refresh_sessions()
        self.refresh_panel()

    def show_header(self) -> None:
        """Name the open conversation as the sidebar does: by its title (its first message, or
        the name the user gave it), by its id only before it has one."""
        try:
            title = self.engine.sessions.get(self.session_id).title
        except KeyError:  # UnknownSessionError: created by its first message
            title = None
        self.sub_title = f"{title or self.session_id} · bot: {self.engine.sessions.bot}"

    def refresh_panel(self) -> None:
        panel = self.query_one(CachePanel)
        panel.show_turns(self.turns)
        panel.show_memory(self.engine.kv_stats(), self.answered, self.answer_hits, self.engine.answer_cache_bound())

    def _busy(self) -> bool:
        if self.generating:
            self.notify("A reply is being generated: wait, or press Esc to cancel it.", severity="warning")
        return self.generating

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and event.option.id != self.session_id and not self._busy():
            await self.open_session(event.option.id)
            self.query_one(PromptInput).focus()

    async def action_new_session(self) -> None:
        if not self._busy():
            await self.open_session(self._fresh_id())
            self.query_one(PromptInput).focus()

    def action_rename_session(self) -> None:
        if self.pending:
            self.notify("Send a first message, then the session can be renamed.", severity="warning")
            return
        current = self.engine.sessions.get(self.session_id).title or ""

        def rename(title: str | None) -> None:
            if title is not None:
                try:
                    self.engine.sessions.rename(self.session_id, title or None)
                except StorageError as exc:  # a title too long, or with a character no database stores
                    self.notify(str(exc), title="Not renamed", severity="warning")
                    return
                self.refresh_sessions()
                self.show_header()

        self.push_screen(RenameScreen(current), rename)

    def action_delete_session(self) -> None:
        if self._busy():
            return
        doomed = self.session_id

        async def delete(yes: bool | None) -> None:
            if not yes:
                return
            if self.pending:
                self.engine.sessions.release(doomed)
            else:
                self.engine.sessions.delete(doomed)
            self.notify(f"Deleted session {doomed}.")
            await self.open_session(self._latest_session() or self._fresh_id())

        self.push_screen(ConfirmScreen(f"Delete session {doomed} and its history?"), delete)

    # -- a turn -------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        if isinstance(event.input, PromptInput):
            event.stop()
            await self.send(event.value)

    async def send(self, text: str) -> None:
        """Start a turn: show the message, then stream the reply in a thread worker."""
        if self._busy():
            return
        try:
            # Cheap: checks the message and builds the generator; the work starts on iteration.
            stream = self.engine.stream(self.session_id, text, max_new_tokens=self.max_new_tokens)
        except Exception as exc:  # InvalidMessageError (empty message) and anything unexpected
            self.notify(str(exc), title="Not sent", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.value = ""
        log = self.query_one(ChatLog)
        await log.add_message("user", text)
        view = await log.add_message("assistant")
        view.border_subtitle = "generating..."
        self.generating = True
        self._cancel.clear()
        self._idle.clear()
        self.refresh_bindings()
        self._generate(stream, view)

    def _await_from_thread(self, callback: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run a coroutine method on the UI from a worker thread, and wait until it is done."""
        # textual types the callback as `T | Awaitable[T]`, from which mypy infers T = Never for
        # a coroutine function: the call is right, the annotation cannot express it.
        self.call_from_thread(callback, *args)  # type: ignore[arg-type]

    @work(thread=True, exclusive=True, group="turn", exit_on_error=False)
    def _generate(self, stream: ReplyStream, view: ChatMessage) -> None:
        error: BaseException | None = None
        pending: list[str] = []
        flushed = 0.0
        try:
            with stream:  # after a break, closing cancels the turn; otherwise it does nothing
                for piece in stream:
                    pending.append(piece)
                    # call_from_thread waits for the UI: hand over at most every FLUSH_S so a
                    # fast model is not slowed down to the speed of rendering Markdown.
                    if time.monotonic() - flushed >= FLUSH_S or self._cancel.is_set():
                        self._await_from_thread(view.add_piece, "".join(pending))
                        pending.clear()
                        flushed = time.monotonic()
                    if self._cancel.is_set():
                        break
            if pending:
                self._await_from_thread(view.add_piece, "".join(pending))
        except Exception as exc:  # the engine's or the UI's (the app has exited): the turn failed
            error = exc
        try:
            self._await_from_thread(self._end_turn, view, stream.reply, error)
        except RuntimeError:
            pass  # the app has already exited
        finally:
            self._idle.set()

    async def _end_turn(self, view: ChatMessage, reply: Reply | None, error: BaseException | None) -> None:
        self.generating = False
        self.refresh_bindings()
        cancelled = self._cancel.is_set()
        if error is not None:
            await view.finish("failed", failed=True)
            self.notify(str(error) or type(error).__name__, title="The turn failed", severity="error")
        else:
            await view.finish("cancelled" if cancelled else None)
        if cancelled:
            self.notify("Reply cancelled: your message is kept.")
        if reply is not None and reply.handed_off:  # the bot falls silent: the message waits for a person
            view.border_subtitle = "handed to a person" if reply.text else "no bot reply: waiting for a person"
            if not reply.text:
                self.notify("A person from the team has this conversation now; they will answer here.")
        if reply is not None:
            turn = TurnRecord.from_reply(reply)
            self.turns.append(turn)
            self.answered += 1
            self.answer_hits += turn.answer_cache_hit
        self.pending = False  # the user's message is in the record, even after an error
        self.show_header()  # titled by that message now
        self.refresh_sessions()
        self.refresh_panel()

    def action_cancel(self) -> None:
        if self.generating:
            self._cancel.set()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return True if self.generating else None  # shown greyed out while idle
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no turn is running (for shutdown, from outside the event loop)."""
        return self._idle.wait(timeout)

    # -- cache, export, bot, layout -----------------------------------------------------

    def action_clear_caches(self) -> None:
        if self._busy():
            return
        freed = self.engine.kv_stats().resident_bytes
        self.engine.sessions.clear_caches()
        self.refresh_panel()
        self.notify(f"Caches cleared ({freed / 1024:.0f} KiB of KV freed); the next turn recomputes its context.")

    def action_export_session(self) -> None:
        if self.pending:
            self.notify("Nothing to export yet: send a message first.", severity="warning")
            return

        def export(directory: str | None) -> None:
            if directory is None:
                return
            target = Path(directory) if directory else default_export_dir()
            try:
                markdown, data = export_session(self.engine.sessions, self.session_id, target)
            except Exception as exc:
                self.notify(str(exc), title="Export failed", severity="error")
                return
            self.notify(f"Wrote {markdown.name} and {data.name} to {markdown.parent}", title="Exported", timeout=15)

        self.push_screen(AskScreen("Export session to directory", str(default_export_dir())), export)

    def action_switch_bot(self) -> None:
        if self._busy():
            return
        if self.engine_factory is None:
            self.notify("Switching bots needs run_tui(engine_factory); restart with --bot.", severity="warning")
            return

        def switch(bot: str | None) -> None:
            if bot is not None:
                self.notify(f"Loading bot {bot or '(none)'}...")
                self._load_engine(bot or None)

        self.push_screen(
            AskScreen("Switch bot", self.bot or "", f"{', '.join(shipped_bots())}, a bot YAML file, or empty for none"),
            switch,
        )

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load_engine(self, bot: str | None) -> None:
        assert self.engine_factory is not None
        try:
            engine = self.engine_factory(bot)
        except Exception as exc:
            self.call_from_thread(self.notify, str(exc), title="Bot not switched", severity="error")
            return
        self._await_from_thread(self._use_engine, engine, bot)

    async def _use_engine(self, engine: ChatEngine, bot: str | None) -> None:
        old, self.engine, self.bot = self.engine, engine, bot
        old.close()  # spills its KV, so switching back later reuses it
        await self.open_session(self._fresh_id())
        self.notify(f"Now chatting with bot {engine.sessions.bot}.")

    def action_toggle_panel(self) -> None:
        self.query_one(CachePanel).toggle_class("-toggled")

    def action_toggle_sidebar(self) -> None:
        self.query_one(SessionList).toggle_class("-toggled")

    def action_help(self) -> None:
        keys = [
            (" ".join(self.get_key_display(Binding(key, b.action)) for key in b.key.split(",")), b.tooltip or b.description)
            for b in self.BINDINGS
            if isinstance(b, Binding)
        ]
        keys += [("Ctrl+P", "Command palette"), ("Ctrl+Q", "Quit")]
        self.push_screen(HelpScreen(keys))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New session", "Start a new conversation", self.action_new_session)
        yield SystemCommand("Rename session", "Give the open session a title", self.action_rename_session)
        yield SystemCommand("Delete session", "Delete the open session and its history", self.action_delete_session)
        yield SystemCommand("Export session", "Write the session as Markdown and JSON", self.action_export_session)
        yield SystemCommand("Clear caches", "Drop the KV and turn caches in memory", self.action_clear_caches)
        yield SystemCommand("Switch bot", "Chat with another bot definition", self.action_switch_bot)
        yield SystemCommand("Toggle cache panel", "Show or hide the cache panel", self.action_toggle_panel)
        yield SystemCommand("Toggle sessions", "Show or hide the sessions sidebar", self.action_toggle_sidebar)
        yield SystemCommand("Help", "List every key", self.action_help)


def run_tui(
    engine: ChatEngine | EngineFactory,
    session_id: str | None = None,
    *,
    bot: str | None = None,
    max_new_tokens: int = 256,
) -> int:
    """Run the chat app in the terminal until the user quits; returns the exit code.

    Args:
        engine: a `ChatEngine`, or a factory `bot -> ChatEngine` (called with `bot` at start and
            again by "Switch bot"; each call must return an engine with its own session store).
        session_id: the session to open; by default a new one (the sidebar lists the others).
        bot: the bot passed to the factory (ignored with an engine, which has its bot already).
        max_new_tokens: reply length limit per turn.

    The app owns the engine: it is closed on exit, which spills its KV to disk so the next
    start continues every session on cached context.
    """
    factory = None if isinstance(engine, ChatEngine) else engine
    current = engine if isinstance(engine, ChatEngine) else engine(bot)
    app = ChatApp(current, engine_factory=factory, session_id=session_id, bot=bot, max_new_tokens=max_new_tokens)
    try:
        app.run()
    finally:
        app._cancel.set()
        app.wait_idle(timeout=30)
        app.engine.close()
    return app.return_code or 0

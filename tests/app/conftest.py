"""Fixtures for the chat app: an engine on the tiny model and an app factory with fixed session ids."""

from __future__ import annotations

import itertools

import pytest

SYSTEM_PROMPT = "You are a helpful assistant."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def engine(tiny_model, make_engine):  # type: ignore[no-untyped-def]
    from chatcache import TokenTierConfig

    engine = make_engine(tiny_model, system_prompt=SYSTEM_PROMPT, token_tier=TokenTierConfig(spill_dir=None))
    yield engine
    engine.close()


@pytest.fixture
def make_app():  # type: ignore[no-untyped-def]
    """`make_app(engine, **kwargs)`: a ChatApp whose new sessions are named s-1, s-2, ..."""
    from chatcache.apps.tui import ChatApp

    def make(engine, **kwargs):  # type: ignore[no-untyped-def]
        counter = itertools.count(1)
        kwargs.setdefault("max_new_tokens", 24)
        kwargs.setdefault("new_session_id", lambda: f"s-{next(counter)}")
        return ChatApp(engine, **kwargs)

    return make


@pytest.fixture
def settle():  # type: ignore[no-untyped-def]
    """`await settle(pilot)`: wait until the turn's worker has finished and the UI has caught up."""

    async def wait(pilot):  # type: ignore[no-untyped-def]
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    return wait


@pytest.fixture
def notices():  # type: ignore[no-untyped-def]
    """`notices(app)` -> a list that fills with (message, severity) as the app notifies."""

    def attach(app):  # type: ignore[no-untyped-def]
        seen: list[tuple[str, str]] = []
        original = app.notify

        def spy(message, **kwargs):  # type: ignore[no-untyped-def]
            seen.append((str(message), kwargs.get("severity", "information")))
            original(message, **kwargs)

        app.notify = spy
        return seen

    return attach


@pytest.fixture
def slow_replies():  # type: ignore[no-untyped-def]
    """`restore = slow_replies(engine, delay)`: pieces arrive `delay` seconds apart (to cancel mid-reply)."""
    import time

    from chatcache import ReplyStream

    def install(engine, delay=0.05):  # type: ignore[no-untyped-def]
        real = engine.stream

        def stream(*args, **kwargs):  # type: ignore[no-untyped-def]
            inner = real(*args, **kwargs)

            def turn():  # type: ignore[no-untyped-def]
                try:
                    for piece in inner:
                        time.sleep(delay)
                        yield piece
                except GeneratorExit:
                    pass  # the reader stopped: the inner turn keeps what was generated
                finally:
                    inner.close()
                return inner.reply

            return ReplyStream(turn())

        engine.stream = stream
        return lambda: setattr(engine, "stream", real)

    return install


@pytest.fixture
def seed_session():  # type: ignore[no-untyped-def]
    """`seed_session(engine, session_id, [(user, reply), ...], title=None)`: a recorded conversation."""

    def seed(engine, session_id, turns, title=None, ttft_ms=12.0):  # type: ignore[no-untyped-def]
        store = engine.store
        store.get_or_create_session(session_id, engine.sessions.user_id, engine.sessions.bot)
        if title:
            store.rename_session(session_id, title)
        for user, reply in turns:
            store.append_message(session_id, "user", user, 1)
            meta = {"tier": "session", "finish_reason": "eos", "ttft_s": ttft_ms / 1000}
            store.append_message(session_id, "assistant", reply, 1, meta)

    return seed

"""The session tier is the record: conversations survive the process, failures keep the user's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache import ChatEngine, TokenTierConfig
from chatcache.storage import SessionStore

SYSTEM = "You are a test bot."


def test_a_new_process_continues_the_conversation_and_restores_its_kv(tiny_model, make_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/chat.db"
    tier = TokenTierConfig(spill_dir=tmp_path / "kv")
    with ChatEngine(tiny_model, system_prompt=SYSTEM, store=url, token_tier=tier) as first:
        first.chat("s", "Hello there", max_new_tokens=10)
        first.chat("s", "Book a table", max_new_tokens=10)
    second = ChatEngine(tiny_model, system_prompt=SYSTEM, store=url, token_tier=tier)
    assert [m.content for m in second.sessions.history("s")][::2] == ["Hello there", "Book a table"]
    got = second.chat("s", "What about Paris?", max_new_tokens=10)
    assert got.stats.tier == "disk"
    never_restarted = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    uncached = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False))
    for engine in (never_restarted, uncached):
        for text in ("Hello there", "Book a table"):
            engine.chat("s", text, max_new_tokens=10)
    want = never_restarted.chat("s", "What about Paris?", max_new_tokens=10)
    assert got.stats.reused_tokens == want.stats.reused_tokens  # the restart cost no reuse
    assert got.token_ids == want.token_ids
    assert got.token_ids == uncached.chat("s", "What about Paris?", max_new_tokens=10).token_ids


def test_generation_error_keeps_the_users_message_and_a_consistent_record(
    tiny_model, make_engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/chat.db"
    engine = make_engine(tiny_model, system_prompt=SYSTEM, store=url)
    engine.chat("s", "Hello there", max_new_tokens=6)
    import chatcache.model.scheduler as scheduler_module

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("device lost")

    monkeypatch.setattr(scheduler_module, "forward", broken)  # the model worker's prefill
    with pytest.raises(RuntimeError, match="device lost"):
        engine.chat("s", "Will this be kept?")
    monkeypatch.undo()
    with SessionStore(url) as store:
        record = [(m.role.value, m.content) for m in store.messages("s")]
    assert record[-1] == ("user", "Will this be kept?")
    assert len(record) == 3
    reply = engine.chat("s", "Next question", max_new_tokens=6)
    assert reply.stats.generated_tokens == 6
    # The failed turn stays in the record but out of the prompt: turns keep alternating.
    assert [m.role for m in engine.sessions.history("s")] == ["user", "assistant"] * 2


def test_ended_session_refuses_new_turns_and_frees_its_kv(tiny_model, make_engine) -> None:  # type: ignore[no-untyped-def]
    from chatcache import SessionClosedError

    engine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    engine.chat("s", "Hello", max_new_tokens=4)
    engine.sessions.end("s")
    assert engine.token_tier.session_kv("s").where != "memory"
    with pytest.raises(SessionClosedError, match="ended"):
        engine.chat("s", "Hello again", max_new_tokens=4)

"""Turn behaviour a user sees: streaming, stop sequences, cancelling, long conversations, bad input."""

from __future__ import annotations

import pytest

from chatcache import ChatEngine, InvalidMessageError, ModelNotFoundError, TokenTierConfig, UnknownSessionError
from chatcache.model.loading import load_chat_model

SYSTEM = "You are a test bot."


@pytest.fixture
def engine(make_engine, tiny_model):  # type: ignore[no-untyped-def]
    return make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))


def test_stream_pieces_join_to_the_reply_text(engine: ChatEngine) -> None:
    stream = engine.stream("s", "Hello there", max_new_tokens=20)
    assert stream.reply is None
    pieces = list(stream)
    assert stream.reply is not None
    assert "".join(pieces) == stream.reply.text
    assert stream.reply.stats.generated_tokens == 20 == len(stream.reply.token_ids)
    assert stream.reply.stats.finish_reason == "length"
    assert stream.reply.stats.ttft_s > 0


def test_stop_sequence_cuts_the_reply(engine: ChatEngine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    full = engine.chat("a", "Hello there", max_new_tokens=30).text
    stop = full[10:13]
    assert stop and stop in full
    reply = engine.chat("b", "Hello there", max_new_tokens=30, stop=[stop])
    assert reply.text == full[: full.index(stop)]
    assert reply.stats.finish_reason == "stop"


def test_cancelled_stream_keeps_the_users_message(engine: ChatEngine) -> None:
    stream = engine.stream("s", "Hello there", max_new_tokens=50)
    iterator = iter(stream)
    next(iterator)
    stream.close()
    history = engine.sessions.history("s")
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[0].content == "Hello there"
    assert stream.reply is not None and stream.reply.stats.finish_reason == "cancelled"
    assert engine.chat("s", "again", max_new_tokens=5).stats.tier == "session"


def test_sampling_is_reproducible_with_a_seed(engine: ChatEngine) -> None:
    a = engine.chat("a", "Hello", max_new_tokens=20, temperature=0.8, top_p=0.9, seed=7)
    b = engine.chat("b", "Hello", max_new_tokens=20, temperature=0.8, top_p=0.9, seed=7)
    greedy = engine.chat("c", "Hello", max_new_tokens=20)
    assert a.token_ids == b.token_ids
    assert a.token_ids != greedy.token_ids


def test_long_conversation_drops_oldest_turns_never_the_system_prompt(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    small = dict(context_window=160)
    cached = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None), **small)
    uncached = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(enabled=False), **small)
    system_ids = cached.system_ids
    dropped = []
    for turn in range(8):
        text = f"Tell me about booking number {turn} please"
        got = cached.chat("s", text, max_new_tokens=16)
        assert got.token_ids == uncached.chat("s", text, max_new_tokens=16).token_ids
        assert got.stats.prompt_tokens + 16 <= 160
        assert cached.token_tier.session_kv("s").ids[: len(system_ids)] == system_ids
        dropped.append(got.stats.dropped_turns)
    assert dropped[0] == 0 and dropped[-1] > 0
    assert dropped == sorted(dropped)  # the oldest leave first, and stay out
    assert len(cached.sessions.history("s")) == 16  # the engine still keeps every turn


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_message_is_refused_and_nothing_changes(engine: ChatEngine, text: str) -> None:
    engine.chat("s", "Hello", max_new_tokens=4)
    with pytest.raises(InvalidMessageError, match="empty"):
        engine.chat("s", text)
    assert len(engine.sessions.history("s")) == 2


def test_message_over_the_context_window_is_refused_and_nothing_changes(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, context_window=128, token_tier=TokenTierConfig(spill_dir=None))
    engine.chat("s", "Hello", max_new_tokens=4)
    with pytest.raises(InvalidMessageError, match="context window of 128"):
        engine.chat("s", "booking " * 300, max_new_tokens=4)
    assert len(engine.sessions.history("s")) == 2
    assert engine.chat("s", "Hello again", max_new_tokens=4).stats.tier == "session"


def test_unknown_model_name_gives_one_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelNotFoundError) as caught:
        load_chat_model(str(tmp_path / "no-such-model"))
    message = str(caught.value)
    assert "no-such-model" in message and "does not exist" in message and "bundled" in message
    with pytest.raises(ModelNotFoundError, match="Hugging Face model id"):
        load_chat_model("nobody/not-a-real-model-xyz")


def test_unknown_session_is_a_clear_error(engine: ChatEngine) -> None:
    with pytest.raises(UnknownSessionError, match="nope"):
        engine.sessions.history("nope")
    with pytest.raises(UnknownSessionError):
        engine.sessions.end("nope")


def test_failed_turn_leaves_the_session_unchanged(engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.chat("s", "Hello", max_new_tokens=4)
    import chatcache.model.scheduler as scheduler_module

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("out of memory")

    monkeypatch.setattr(scheduler_module, "forward", broken)  # the model worker's prefill
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.chat("s", "Second")
    monkeypatch.undo()
    assert len(engine.sessions.history("s")) == 2
    assert engine.token_tier.resident_bytes() == engine.kv_stats().resident_bytes
    assert engine.chat("s", "Second", max_new_tokens=4).stats.generated_tokens == 4


def test_a_replayed_answer_streams_a_piece_per_token_that_join_back_exactly(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from chatcache.model.text_stream import token_pieces

    tokenizer = tiny_model.tokenizer
    for text in ("The capital of France is Paris.", "  Café — naïve 日本語 🙂 done\n", "x"):
        pieces = token_pieces(tokenizer, text)
        assert "".join(pieces) == text and all(pieces)
    plain = "The capital of France is Paris."
    assert len(token_pieces(tokenizer, plain)) == len(tokenizer.encode(plain, add_special_tokens=False))
    assert token_pieces(tokenizer, "") == [""]

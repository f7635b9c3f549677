"""Input the engine refuses: a clear chatcache error at once, and nothing recorded, not even a session."""

from __future__ import annotations

import pytest

from chatcache import ChatEngine, ConfigError, GenerationConfig, InvalidIdError, InvalidMessageError, TokenTierConfig

SYSTEM = "You are a test bot."


@pytest.fixture
def engine(make_engine, tiny_model) -> ChatEngine:  # type: ignore[no-untyped-def]
    built: ChatEngine = make_engine(tiny_model, system_prompt=SYSTEM, token_tier=TokenTierConfig(spill_dir=None))
    return built


@pytest.mark.parametrize("text, problem", [("a\x00b", "NUL"), ("caf\udce9", "lone surrogate")], ids=["NUL", "surrogate"])
def test_a_message_no_database_can_store_is_refused_before_anything_is_recorded(
    engine: ChatEngine, text: str, problem: str
) -> None:
    with pytest.raises(InvalidMessageError, match=f"contains a {problem}.*remove that character"):
        engine.stream("new", text)  # at once, before iterating
    assert engine.sessions.all() == []
    engine.chat("s", "Hello", max_new_tokens=4)
    with pytest.raises(InvalidMessageError, match=problem):
        engine.chat("s", text)
    assert [m.content for m in engine.sessions.records("s")][0] == "Hello"
    assert len(engine.sessions.records("s")) == 2


SETTINGS = {
    "temperature nan": dict(temperature=float("nan")),
    "temperature inf": dict(temperature=float("inf")),
    "temperature text": dict(temperature="0.5"),
    "top_p nan": dict(top_p=float("nan")),
    "top_p inf": dict(top_p=float("inf")),
    "max_new_tokens float": dict(max_new_tokens=2.5),
    "max_new_tokens text": dict(max_new_tokens="8"),
    "max_new_tokens bool": dict(max_new_tokens=True),
    "seed text": dict(seed="7"),
    "stop not text": dict(stop=[3]),
}


@pytest.mark.parametrize("setting", SETTINGS.values(), ids=SETTINGS.keys())
def test_a_decoding_setting_that_can_never_work_is_a_config_error_before_anything_is_recorded(
    engine: ChatEngine, setting: dict[str, object]
) -> None:
    (name,) = setting
    with pytest.raises(ConfigError, match=name):
        engine.stream("s", "Hello", **setting)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=name):
        GenerationConfig(**setting)  # type: ignore[arg-type]
    assert engine.sessions.all() == []


def test_ordinary_settings_still_pass() -> None:
    import numpy as np

    config = GenerationConfig(max_new_tokens=np.int64(8), temperature=np.float32(0.7), top_p=1, seed=3, stop="\n")  # type: ignore[arg-type]
    assert config.stop == ("\n",)


def test_a_first_message_too_long_for_the_context_window_creates_no_session(make_engine, tiny_model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, context_window=128, token_tier=TokenTierConfig(spill_dir=None))
    with pytest.raises(InvalidMessageError, match="context window of 128"):
        engine.chat("new", "booking " * 300, max_new_tokens=4)
    assert engine.sessions.all() == []
    assert engine.store.count_sessions() == 0
    assert engine.chat("new", "Hello", max_new_tokens=4).stats.generated_tokens == 4


@pytest.mark.parametrize("session_id", ["", "x" * 129, "a\x00b", "a\nb"], ids=["empty", "too long", "NUL", "newline"])
def test_a_bad_session_id_is_refused_by_the_session_tier_before_anything_is_recorded(
    engine: ChatEngine, session_id: str
) -> None:
    with pytest.raises(InvalidIdError, match="use 1 to 128 printable characters"):
        engine.chat(session_id, "Hello", max_new_tokens=4)
    with pytest.raises(InvalidIdError):
        engine.sessions.history(session_id)
    assert engine.store.count_sessions() == 0


def test_a_reply_in_which_the_model_wrote_a_nul_is_shown_and_recorded_with_a_replacement_character(
    engine: ChatEngine, tiny_model, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    import itertools

    import chatcache.model.generation as generation_module

    nul = tiny_model.tokenizer.convert_tokens_to_ids("\u0100")  # byte-level BPE's token for the byte 0x00
    assert tiny_model.tokenizer.decode([nul]) == "\x00"
    real, picks = generation_module.pick, itertools.count()

    def writes_a_nul(*args, **kwargs):  # type: ignore[no-untyped-def]
        token = real(*args, **kwargs)
        return nul if next(picks) == 1 else token

    monkeypatch.setattr(generation_module, "pick", writes_a_nul)
    stream = engine.stream("s", "Hello", max_new_tokens=4)
    shown = "".join(stream)
    assert stream.reply is not None and nul in stream.reply.token_ids  # the ids stay exact
    assert "\x00" not in shown and "\ufffd" in shown and shown == stream.reply.text
    assert engine.sessions.records("s")[1].content == shown

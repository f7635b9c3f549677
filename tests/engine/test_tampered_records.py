"""Rows edited or damaged outside chatcache: the conversation goes on, and nothing in it is lost.

A reply's stored token ids only let the token tier see it exactly as generated; its text is the
record. Ids the model cannot take are dropped (with a warning) and the text is encoded instead.
A window start that is not an even count of messages starts the window at 0: laying out the
next prompt drops the oldest turns again until it fits.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from chatcache import ChatEngine, TokenTierConfig

SYSTEM = "You are a test bot."
NO_SPILL = TokenTierConfig(spill_dir=None)  # each engine computes its KV from the record alone


def recorded_conversation(tiny_model, path: Path) -> None:  # type: ignore[no-untyped-def]
    with ChatEngine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{path}", token_tier=NO_SPILL) as engine:
        engine.chat("s", "Hello there", max_new_tokens=6)
        engine.chat("s", "Book a table", max_new_tokens=6)


def copy_of(path: Path, name: str) -> Path:
    copy = path.with_name(name)
    with sqlite3.connect(path) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return copy


def set_first_reply_ids(path: Path, token_ids: object) -> None:
    with sqlite3.connect(path) as conn:
        (meta,) = conn.execute("SELECT meta FROM messages WHERE session_id = 's' AND seq = 2").fetchone()
        conn.execute(
            "UPDATE messages SET meta = ? WHERE session_id = 's' AND seq = 2",
            (json.dumps({**json.loads(meta), "token_ids": token_ids}),),
        )


def set_window_start(path: Path, value: object) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE sessions SET state = ? WHERE id = 's'", (json.dumps({"context_start": value}),))


TAMPERED_IDS = {
    "past the vocabulary": [5, 10**6],
    "negative": [5, -1],
    "text": ["5", "6"],
    "floats": [5.0, 6.5],
    "booleans": [True, False],
    "not a list": "5 6",
}


@pytest.mark.parametrize("token_ids", TAMPERED_IDS.values(), ids=TAMPERED_IDS.keys())
def test_a_reply_with_token_ids_the_model_cannot_take_is_encoded_from_its_text(
    tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture, token_ids: object  # type: ignore[no-untyped-def]
) -> None:
    tampered = tmp_path / "tampered.db"
    recorded_conversation(tiny_model, tampered)
    without_ids = copy_of(tampered, "without-ids.db")
    set_first_reply_ids(tampered, token_ids)
    set_first_reply_ids(without_ids, [])  # a reply stored with no ids: its text is encoded
    engines = [
        ChatEngine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{path}", token_tier=NO_SPILL)
        for path in (tampered, without_ids)
    ]
    with caplog.at_level(logging.WARNING, logger="chatcache"):
        history = engines[0].sessions.history("s")
    assert "message 2: its stored token ids are not ids of this model" in caplog.text
    assert history[1].generated_ids is None and history[3].generated_ids is not None
    assert [m.content for m in history] == [m.content for m in engines[1].sessions.history("s")]  # nothing lost
    got, want = (engine.chat("s", "What about Paris?", max_new_tokens=6) for engine in engines)
    assert got.token_ids == want.token_ids
    for engine in engines:
        engine.close()


BAD_STARTS = {"text": "2", "float": 2.0, "negative": -2, "odd": 3, "null": None, "list": [2], "NaN": float("nan")}


@pytest.mark.parametrize("start", BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_a_window_start_that_is_not_an_even_count_starts_the_window_at_zero(
    tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture, start: object  # type: ignore[no-untyped-def]
) -> None:
    tampered = tmp_path / "tampered.db"
    recorded_conversation(tiny_model, tampered)
    untouched = copy_of(tampered, "untouched.db")
    set_window_start(tampered, start)
    set_window_start(untouched, 0)
    engines = [
        ChatEngine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{path}", token_tier=NO_SPILL)
        for path in (tampered, untouched)
    ]
    with caplog.at_level(logging.WARNING, logger="chatcache"):
        assert len(engines[0].sessions.history("s")) == 4
    assert "context_start" in caplog.text and "starting the window at 0" in caplog.text
    assert engines[0].sessions.open("s", create=False).conversation.context_start == 0
    got, want = (engine.chat("s", "What about Paris?", max_new_tokens=6) for engine in engines)
    assert got.token_ids == want.token_ids and got.stats.dropped_turns == 0
    for engine in engines:
        engine.close()


def test_a_window_start_past_the_last_turn_is_clamped_to_it(tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tampered.db"
    recorded_conversation(tiny_model, path)
    set_window_start(path, 10**30)
    with ChatEngine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{path}", token_tier=NO_SPILL) as engine:
        assert engine.sessions.open("s", create=False).conversation.context_start == 4
        assert engine.chat("s", "What about Paris?", max_new_tokens=6).stats.dropped_turns == 2


@pytest.mark.parametrize("meta", ["[1, 2]", '"x"', "3"], ids=["list", "string", "number"])
def test_a_reply_whose_meta_is_not_an_object_reads_as_having_none(
    tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture, meta: str  # type: ignore[no-untyped-def]
) -> None:
    tampered = tmp_path / "tampered.db"
    recorded_conversation(tiny_model, tampered)
    with sqlite3.connect(tampered) as conn:
        conn.execute("UPDATE messages SET meta = ? WHERE session_id = 's' AND seq = 2", (meta,))
    with ChatEngine(tiny_model, system_prompt=SYSTEM, store=f"sqlite:///{tampered}", token_tier=NO_SPILL) as engine:
        with caplog.at_level(logging.WARNING, logger="chatcache"):
            history = engine.sessions.history("s")
        assert "message 2: its meta is not a JSON object" in caplog.text
        assert len(history) == 4 and history[1].generated_ids is None  # the reply's text is kept
        assert engine.chat("s", "What about Paris?", max_new_tokens=6).stats.generated_tokens == 6


@pytest.mark.parametrize(
    "tampered",
    [{"state": "NOT_A_STATE"}, "CONFIRMING", {"state": "CONFIRMING", "confidence": "high"}, {"slots": 5}],
    ids=["unknown state", "not an object", "confidence not a number", "slots not an object"],
)
def test_an_unreadable_dialogue_state_reads_as_none(tampered: object, caplog: pytest.LogCaptureFixture) -> None:
    """The conversation starts its flow over, with a warning, rather than failing every turn."""
    from chatcache.tiers.conversations import stored_dialogue

    with caplog.at_level(logging.WARNING, logger="chatcache"):
        assert stored_dialogue("s", {"dialogue": tampered}) is None
    assert "session 's': its stored dialogue state is unreadable" in caplog.text
    assert stored_dialogue("s", {}) is None and stored_dialogue("s", {"dialogue": None}) is None

"""The engine's `admit` hook: a turn refused before the model records nothing and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatcache import TokenTierConfig

TURNS = [
    "I want to transfer 200 dollars to account 12345674",
    "yes, do it",
    "What are your opening hours on Saturday?",
    "And on Sunday, are you open then?",
]


class Refused(Exception):
    pass


def refuse(prefill_tokens: int, fits_in_memory: bool, restore_s: float) -> None:
    assert prefill_tokens > 0 and fits_in_memory and restore_s == 0.0
    raise Refused(f"{prefill_tokens} tokens to prefill")


@pytest.fixture
def bank(make_engine, tiny_model, toy_embed, tmp_path: Path):  # type: ignore[no-untyped-def]
    def build(name: str):  # type: ignore[no-untyped-def]
        return make_engine(
            tiny_model, bot="customer_service", embedder=toy_embed, drift=True,
            store=f"sqlite:///{tmp_path}/{name}.db", token_tier=TokenTierConfig(spill_dir=None),
        )  # fmt: skip

    return build


def test_a_refused_turn_leaves_record_dialogue_drift_and_kv_as_if_it_never_came(bank) -> None:  # type: ignore[no-untyped-def]
    refused, never = bank("refused"), bank("never")
    for text in TURNS[:2]:
        refused.chat("s", text, max_new_tokens=6)
        never.chat("s", text, max_new_tokens=6)
    before = (refused.sessions.history("s"), refused.store.get_session("s").version, refused.kv_stats().resident_bytes)
    for _ in range(3):  # a client retrying while the server is saturated
        with pytest.raises(Refused):
            list(refused.stream("s", TURNS[2], max_new_tokens=6, admit=refuse))
    assert (refused.sessions.history("s"), refused.store.get_session("s").version, refused.kv_stats().resident_bytes) == before
    assert len(refused.store.messages("s")) == 4
    for text in TURNS[2:]:
        got, expected = refused.chat("s", text, max_new_tokens=6), never.chat("s", text, max_new_tokens=6)
        assert (got.text, got.stats.drift, got.dialogue_state) == (expected.text, expected.stats.drift, expected.dialogue_state)
        assert got.stats.prompt_tokens == expected.stats.prompt_tokens
    assert never.sessions.history("s")[4].content == TURNS[2]


def test_the_flows_own_questions_never_ask_for_admission(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank("flow")
    reply = engine.chat("s", TURNS[0], max_new_tokens=6)  # the flow asks to confirm: no model turn
    assert reply.stats.tier == "dialog"
    engine.sessions.release("s")
    asked = list(engine.stream("t", TURNS[0], max_new_tokens=6, admit=refuse))
    assert "".join(asked) == reply.text


def test_a_refused_first_turn_leaves_no_session_but_a_created_empty_one_stays(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank("first")
    with pytest.raises(Refused):
        list(engine.stream("new", TURNS[2], max_new_tokens=6, admit=refuse))
    assert [s.id for s in engine.sessions.all()] == []  # the row its first turn created is gone again
    engine.sessions.create("made")  # made empty on purpose (the sessions API): a refusal keeps it
    with pytest.raises(Refused):
        list(engine.stream("made", TURNS[2], max_new_tokens=6, admit=refuse))
    assert [s.id for s in engine.sessions.all()] == ["made"]
    assert engine.chat("new", TURNS[2], max_new_tokens=6).text  # the id is free: the retry starts it
    assert len(engine.sessions.records("new")) == 2

"""HCAC: the dialogue state machine drives the tiers: flow replies, promotion, release, expiry."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from chatcache import TokenTierConfig, TurnTierConfig
from chatcache.steering.drift_model import SHIPPED_MODEL
from chatcache.dialog import State
from chatcache.tiers.conversations import stored_dialogue
from chatcache.storage import SessionStore, StaleVersionError

TRANSFER = "I want to transfer 200 dollars to account 12345674"


def stored_flow_state(engine) -> State | None:  # type: ignore[no-untyped-def]
    """Where session "s" stands in its flow, as the session tier keeps it."""
    dialogue = stored_dialogue("s", engine.sessions.get("s").state)
    return dialogue.state if dialogue is not None else None


@pytest.fixture
def bank(make_engine, tiny_model, toy_embed, tmp_path: Path):  # type: ignore[no-untyped-def]
    def build(**kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("store", f"sqlite:///{tmp_path}/bank.db")
        kwargs.setdefault("token_tier", TokenTierConfig(spill_dir=tmp_path / "kv"))
        return make_engine(tiny_model, bot="customer_service", embedder=toy_embed, **kwargs)

    return build


def test_flow_asks_for_confirmation_without_running_the_model(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank()
    reply = engine.chat("s", TRANSFER, max_new_tokens=8)
    assert reply.intent == "transfer_money" and reply.dialogue_state == "CONFIRMING"
    assert reply.stats.tier == "dialog" and reply.stats.generated_tokens == 0
    assert "200" in reply.text and "12345674" in reply.text
    session = engine.sessions.get("s")
    dialogue = stored_dialogue("s", session.state)
    assert dialogue is not None and dialogue.state == State.CONFIRMING and dialogue.flow_active
    assert session.pinned is True  # mid-flow: the session tier keeps it from expiring
    assert session.version >= 1


def test_confirmed_intent_is_promoted_and_remembered_after_a_restart(bank, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = bank()
    engine.chat("s", TRANSFER, max_new_tokens=8)
    before = engine.sessions.get("s").version
    reply = engine.chat("s", "yes, do it", max_new_tokens=8)
    assert reply.stats.tier != "dialog"  # the model answers once the flow acts
    facts = {(f.kind.value, f.name): f.value for f in engine.store.facts("s")}
    assert facts == {("intent", "current"): "transfer_money", ("slot", "amount"): "200", ("slot", "to_account"): "12345674"}
    assert engine.sessions.get("s").version > before
    assert stored_flow_state(engine) == State.DONE
    engine.close()
    restarted = bank()
    conversation = restarted.sessions.open("s", create=False).conversation
    assert conversation.system is not None and "to_account: 12345674" in conversation.system.content
    follow_up = restarted.chat("s", "and what was the amount again", max_new_tokens=8)
    assert follow_up.stats.tier == "disk"  # the facts are in the prompt the spilled KV was built on


def test_unconfirmed_intent_stays_in_the_turn_tier(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank(promote_threshold=1.0)  # confidence alone never promotes
    engine.chat("s", "I want to transfer money", max_new_tokens=8)
    assert engine.store.facts("s") == []
    entries = engine.sessions.loaded("s").entries
    assert entries.get("intent_candidate")[0] == "transfer_money"
    assert entries.get("unconfirmed_slots") == {}


def test_ending_a_session_releases_turn_and_token_tiers(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank()
    engine.chat("s", "What are your opening hours?", max_new_tokens=8)
    assert engine.sessions.loaded("s").entries.items() and engine.token_tier.session_kv("s").where == "memory"
    engine.sessions.end("s")
    assert engine.sessions.loaded("s") is None  # its memory, turn-tier entries with it
    assert engine.token_tier.session_kv("s").where != "memory"
    assert engine.sessions.get("s").status.value == "ended"


def test_expired_sessions_release_their_tiers(make_engine, tiny_model, toy_embed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    store = SessionStore(f"sqlite:///{tmp_path}/ttl.db", ttl=timedelta(hours=24), clock=lambda: now[0])
    engine = make_engine(tiny_model, bot="customer_service", embedder=toy_embed, store=store)
    engine.chat("idle", "What are your opening hours?", max_new_tokens=4)
    engine.chat("busy", "I want to transfer money", max_new_tokens=4)  # a flow is in progress
    now[0] += timedelta(hours=25)
    assert engine.sessions.expire() == ["idle"]
    assert engine.sessions.loaded("idle") is None and engine.token_tier.session_kv("idle").where != "memory"
    assert engine.sessions.get("busy").status.value == "active"
    assert engine.sessions.loaded("busy").entries.get("intent_candidate")[0] == "transfer_money"


def test_a_turn_writes_the_session_tier_twice_its_message_then_one_commit(bank, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Even the turn that confirms a flow (its state, the action, the facts) writes its user
    message on arrival and everything else in one transaction at the end, which also hands back
    the stored facts: no second read."""
    engine = bank()
    engine.chat("s", TRANSFER, max_new_tokens=8)
    calls: list[str] = []
    for name in ("append_message", "commit_turn", "update_state", "upsert_fact", "facts"):
        method = getattr(engine.store, name)
        monkeypatch.setattr(engine.store, name, lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1])
    reply = engine.chat("s", "yes, do it", max_new_tokens=8)
    assert calls == ["append_message", "commit_turn"]
    monkeypatch.undo()
    stored = engine.store.facts("s")
    assert reply.dialogue_state == "DONE" and len(stored) == 3
    assert sorted(engine.sessions.open("s", create=False).conversation.facts, key=lambda f: (f.kind, f.name)) == stored


def test_a_state_changed_outside_the_lease_fails_the_turn_and_stores_none_of_it(bank) -> None:  # type: ignore[no-untyped-def]
    """Another writer changes the session's state while a turn runs (between its pieces): the
    turn's commit fails, and nothing of the turn but the user's message is stored."""
    engine = bank()
    engine.chat("s", TRANSFER, max_new_tokens=8)
    facts = engine.store.facts("s")
    with engine.stream("s", "yes, do it", max_new_tokens=8) as turn:
        next(turn)  # the turn is under way: understood and serving
        stored = engine.sessions.get("s")
        engine.store.update_state("s", {**stored.state, "other_writer": 1}, stored.version)  # ignores the lease
        with pytest.raises(StaleVersionError):
            for _ in turn:
                pass
    assert [m.role.value for m in engine.sessions.records("s")] == ["user", "assistant", "user"]
    assert engine.store.facts("s") == facts
    assert stored_flow_state(engine) == State.CONFIRMING
    again = engine.chat("s", "yes, do it", max_new_tokens=8)  # rebuilt from the record, the flow goes on
    assert again.dialogue_state == "DONE" and len(engine.store.facts("s")) == 3


def test_drift_drops_the_old_topic_from_the_prompt_and_the_turn_tier(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank(drift=True)
    first = engine.chat("s", "What are your opening hours on Saturday?", max_new_tokens=6)
    assert not first.stats.drift
    engine.sessions.loaded("s").entries.put("old-topic-note", "kept for this topic only")
    switched = engine.chat("s", "Please send 200 dollars to account 12345674", max_new_tokens=6)
    assert switched.stats.drift
    assert engine.sessions.loaded("s").entries.get("old-topic-note") is None
    conversation = engine.sessions.open("s", create=False).conversation
    assert conversation.context_start == 2  # the first turn left the prompt...
    assert len(engine.sessions.history("s")) == 4  # ...but not the record
    assert engine.sessions.get("s").state["context_start"] == 2
    follow = engine.chat("s", "yes", max_new_tokens=6)  # the flow goes on in the new topic
    assert not follow.stats.drift and follow.intent == "transfer_money"
    assert "on Saturday" not in engine.renderer.tokenizer.decode(engine.token_tier.session_kv("s").ids)


def test_a_turn_back_on_the_dropped_topic_undoes_the_drift_reset(bank) -> None:  # type: ignore[no-untyped-def]
    """A false drift costs a turn, not the conversation: the next informative turn that goes back
    to the dropped topic brings the dropped turns back into the prompt, and the session tier
    keeps that across a restart of the process."""
    engine = bank(drift=True)
    engine.chat("s", "What are your opening hours on Saturday?", max_new_tokens=6)
    assert engine.chat("s", "Please send 200 dollars to account 12345674", max_new_tokens=6).stats.drift
    assert engine.sessions.get("s").state["reset_from"] == 0
    engine.close()
    restarted = bank(drift=True)
    assert restarted.chat("s", "ok", max_new_tokens=6).stats.drift_undone is False  # says nothing about the topic: still pending
    back = restarted.chat("s", "And what are your opening hours on Sunday?", max_new_tokens=6)
    assert back.stats.drift_undone and not back.stats.drift
    state = restarted.store.get_session("s").state
    assert (state["context_start"], state["reset_from"]) == (0, None)
    assert any("on Saturday" in m.content for m in restarted.sessions.open("s", create=False).conversation.window())


def test_a_turn_on_the_new_topic_makes_the_drift_reset_final(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank(drift=True)
    engine.chat("s", "What are your opening hours on Saturday?", max_new_tokens=6)
    assert engine.chat("s", "Please send 200 dollars to account 12345674", max_new_tokens=6).stats.drift
    follow = engine.chat("s", "Send the money from my checking account", max_new_tokens=6)
    assert not follow.stats.drift_undone and not follow.stats.drift
    state = engine.sessions.get("s").state
    assert (state["context_start"], state["reset_from"]) == (2, None)
    assert not any("on Saturday" in m.content for m in engine.sessions.open("s", create=False).conversation.window())


def test_drift_is_judged_against_the_assistant_turn_and_the_finished_flow(bank, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    engine = bank(drift=True)
    detector = engine.coordinator.drift
    seen: list[dict] = []
    observe = detector.observe

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs)
        return observe(*args, **kwargs)

    monkeypatch.setattr(detector, "observe", recording)
    asked = engine.chat("s", TRANSFER, max_new_tokens=6)  # the flow asks for confirmation
    done = engine.chat("s", "yes, do it", max_new_tokens=6)  # the flow acts: the task is done
    engine.chat("s", "What are your opening hours on Saturday?", max_new_tokens=6)
    assert seen[0]["assistant_text"] is None and seen[0]["assistant_embedding"] is None
    assert seen[1]["assistant_text"] == asked.text and not seen[1]["task_closed"]
    assert seen[1]["assistant_embedding"] is not None
    assert seen[2]["assistant_text"] == done.text and seen[2]["task_closed"]


def test_a_new_process_judges_drift_against_the_stored_topic(bank) -> None:  # type: ignore[no-untyped-def]
    first = bank(drift=True)
    first.chat("s", "What are your opening hours on Saturday?", max_new_tokens=6)
    first.close()
    restarted = bank(drift=True)
    switched = restarted.chat("s", "Please send 200 dollars to account 12345674", max_new_tokens=6)
    assert switched.stats.drift  # not taken for the conversation's first turn
    assert restarted.sessions.open("s", create=False).conversation.context_start == 2


@pytest.mark.bundled
def test_drift_is_decided_by_the_learned_model_with_the_bundled_embedder_only(  # type: ignore[no-untyped-def]
    bank, make_engine, tiny_model, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shipped model reads the bundled MiniLM's similarities: with another embedder the rule
    decides, and each engine says which when it starts."""
    with caplog.at_level(logging.INFO, logger="chatcache"):
        bank(drift=True)
        make_engine(tiny_model, drift=True, token_tier=TokenTierConfig(spill_dir=tmp_path / "kv-bundled"))
    said = [record.getMessage() for record in caplog.records if record.getMessage().startswith("drift is decided by")]
    assert said == ["drift is decided by the hand-built rule (the learned model reads the bundled embedder's similarities only)",
                    f"drift is decided by the learned model {SHIPPED_MODEL.name}"]  # fmt: skip


def test_upkeep_drops_expired_turn_tier_entries_of_live_sessions(bank) -> None:  # type: ignore[no-untyped-def]
    engine = bank(turn_tier=TurnTierConfig(ttl_s=0.5))
    engine.chat("s", "I want to transfer money", max_new_tokens=4)
    entries = engine.sessions.loaded("s").entries
    assert len(entries) > 0  # kept until purged, expired or not
    time.sleep(0.6)  # past the entries' TTL
    assert engine.sessions.expire() == []  # the session itself is far from its TTL
    assert len(entries) == 0
    assert engine.sessions.get("s").status.value == "active"

"""`commit_turn`: a turn's reply, state and facts are stored together or not at all."""

from __future__ import annotations

import pytest

from chatcache.storage import LeaseLostError, NewFact, SessionStore, StaleVersionError


def _asked(store: SessionStore) -> tuple[int, int]:
    session = store.create_session("s1", "ada", "bank")
    question = store.append_message("s1", "user", "send 200 to Bob", 5)
    return question.seq, session.version


def test_the_reply_state_and_facts_are_stored_together(store: SessionStore) -> None:
    seq, version = _asked(store)
    facts = [NewFact("intent", "current", "transfer", 0.97, 1), NewFact("slot", "amount", "200", 0.97, 1)]
    committed = store.commit_turn(
        "s1", "Sending 200 to Bob.", 6, {"tier": "model"}, reply_to=seq, state={"step": "confirm"},
        expected_version=version, pinned=True, facts=facts,
    )  # fmt: skip
    reply, session = committed.reply, committed.session
    assert (reply.role.value, reply.reply_to, reply.seq) == ("assistant", seq, seq + 1)
    assert session.state == {"step": "confirm"} and session.version == version + 1 and session.pinned
    assert [(f.kind.value, f.name, f.value) for f in store.facts("s1")] == [("intent", "current", "transfer"), ("slot", "amount", "200")]
    assert committed.facts == store.facts("s1"), "what it returns is what it stored, ids and times included"
    assert [m.content for m in store.messages("s1")] == ["send 200 to Bob", "Sending 200 to Bob."]


def test_a_fact_learned_again_replaces_the_stored_one(store: SessionStore) -> None:
    seq, version = _asked(store)
    store.upsert_fact("s1", "slot", "amount", "100", 0.9, 0)
    committed = store.commit_turn(
        "s1", "Sending 200.", 3, None, reply_to=seq, state={}, expected_version=version,
        facts=[NewFact("slot", "amount", "200", 0.97, 1)],
    )  # fmt: skip
    assert committed.facts == store.facts("s1") and [f.value for f in committed.facts] == ["200"]


def test_a_stale_state_stores_nothing_of_the_turn(store: SessionStore) -> None:
    seq, version = _asked(store)
    store.update_state("s1", {"other": "writer"}, version)
    with pytest.raises(StaleVersionError):
        store.commit_turn(
            "s1", "reply", 1, None, reply_to=seq, state={"step": "x"}, expected_version=version,
            facts=[NewFact("slot", "amount", "200", 0.9, 1)],
        )  # fmt: skip
    assert [m.role.value for m in store.messages("s1")] == ["user"]
    assert store.facts("s1") == []
    assert store.get_session("s1").state == {"other": "writer"}


def test_a_lost_lease_stores_nothing_of_the_turn(store: SessionStore) -> None:
    seq, version = _asked(store)
    assert store.leases.try_acquire("s1", "other-process") is not None
    with pytest.raises(LeaseLostError):
        store.commit_turn(
            "s1", "reply", 1, None, reply_to=seq, state={"step": "x"}, expected_version=version,
            facts=[NewFact("slot", "amount", "200", 0.9, 1)], lease="this-process",
        )  # fmt: skip
    assert [m.role.value for m in store.messages("s1")] == ["user"]
    assert store.facts("s1") == [] and store.get_session("s1").version == version


def test_a_bad_fact_is_refused_before_anything_is_written(store: SessionStore) -> None:
    seq, version = _asked(store)
    with pytest.raises(ValueError, match="confidence"):
        store.commit_turn(
            "s1", "reply", 1, None, reply_to=seq, state={}, expected_version=version,
            facts=[NewFact("slot", "amount", "200", 1.5, 1)],
        )  # fmt: skip
    assert [m.role.value for m in store.messages("s1")] == ["user"]

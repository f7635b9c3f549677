"""Claiming a handed-off session: one person at a time answers it, across replicas."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from chatcache.storage import InvalidTextError, SessionClaimedError, SessionStore, UnknownSessionError, migrations
from chatcache.storage.migrations import MIGRATIONS
from tests.session_tier.test_storage_migrations import insert_old_session


def test_the_second_person_to_claim_is_told_who_has_it(store: SessionStore) -> None:
    store.create_session("s1", "ada", "bank")
    assert store.get_session("s1").claimed_by is None
    assert store.claim_session("s1", "sam").claimed_by == "sam"
    assert store.claim_session("s1", "sam").claimed_by == "sam"  # claiming again as the holder changes nothing
    with pytest.raises(SessionClaimedError, match="sam has already taken over") as refused:
        store.claim_session("s1", "kim")
    assert refused.value.holder == "sam"
    assert store.get_session("s1").claimed_by == "sam"


def test_a_released_claim_can_be_taken_by_someone_else(store: SessionStore) -> None:
    store.create_session("s1", "ada", "bank")
    store.claim_session("s1", "sam")
    assert store.release_claim("s1").claimed_by is None
    assert store.claim_session("s1", "kim").claimed_by == "kim"


def test_a_claim_needs_a_session_and_a_name(store: SessionStore) -> None:
    with pytest.raises(UnknownSessionError):
        store.claim_session("nope", "sam")
    store.create_session("s1", "ada", "bank")
    for bad in ("", "   ", "x" * 65, "nul\x00"):
        with pytest.raises(InvalidTextError):
            store.claim_session("s1", bad)
    assert store.get_session("s1").claimed_by is None


def test_replicas_claiming_at_once_leave_exactly_one_holder(store_url: str | URL) -> None:
    """Eight stores (as eight replicas would open) claim one session at the same moment: one
    wins, the seven others are refused and named the winner."""
    with SessionStore(store_url) as first:
        first.create_session("s1", "ada", "bank")
    stores = [SessionStore(store_url) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    won: list[str] = []
    told: list[str] = []

    def claim(store: SessionStore, agent: str) -> None:
        barrier.wait()
        try:
            won.append(store.claim_session("s1", agent).claimed_by or "")
        except SessionClaimedError as refused:
            told.append(refused.holder)

    threads = [threading.Thread(target=claim, args=(s, f"agent-{i}")) for i, s in enumerate(stores)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for opened in stores:
            opened.close()
    assert len(won) == 1 and told == [won[0]] * 7


def test_a_version_5_database_gains_claims_and_keeps_its_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as older:
        older.setattr(migrations, "MIGRATIONS", MIGRATIONS[:5])
        with SessionStore.open(tmp_path) as store:
            assert store.schema_version == 5
    insert_old_session(tmp_path, "s1", {"step": 1})
    with SessionStore.open(tmp_path) as store:
        assert store.schema_version == MIGRATIONS[-1].version >= 6
        assert store.get_session("s1").claimed_by is None and store.get_session("s1").state == {"step": 1}
        assert store.claim_session("s1", "sam").claimed_by == "sam"

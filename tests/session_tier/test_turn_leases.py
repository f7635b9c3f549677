"""Turn leases: one holder at a time, expiry after a crash, writes fenced by the lease."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from chatcache.storage import LeaseLostError, SessionBusyError, SessionStore
from chatcache.storage.leases import TurnLeases
from tests.session_tier.fake_clock import FakeClock


def test_only_one_holder_at_a_time_and_the_head_says_what_is_stored(store: SessionStore) -> None:
    store.create_session("s", "u", "b")
    first = store.leases.try_acquire("s", "one")
    assert first is not None and first.last_seq == 0 and first.version == 1
    assert store.leases.try_acquire("s", "two") is None
    assert store.leases.try_acquire("s", "one") is not None  # the holder may take it again
    store.append_message("s", "user", "hi", 1, lease="one")
    store.leases.release("s", "one")
    second = store.leases.try_acquire("s", "two")
    assert second is not None and second.last_seq == 1


def test_a_crashed_holders_lease_runs_out(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s", "u", "b")
    assert store.leases.try_acquire("s", "crashed") is not None
    clock.advance(seconds=store.leases.ttl.total_seconds() - 1)
    assert store.leases.try_acquire("s", "next") is None
    clock.advance(seconds=2)
    assert store.leases.try_acquire("s", "next") is not None


def test_a_write_under_a_lost_lease_is_refused_and_writes_nothing(store: SessionStore, clock: FakeClock) -> None:
    store.create_session("s", "u", "b")
    store.leases.try_acquire("s", "stalled")
    store.append_message("s", "user", "question", 1, lease="stalled")
    clock.advance(seconds=store.leases.ttl.total_seconds() + 1)
    store.leases.try_acquire("s", "other")
    with pytest.raises(LeaseLostError, match="taken over"):
        store.append_message("s", "assistant", "late reply", 2, reply_to=1, lease="stalled")
    assert [m.content for m in store.messages("s")] == ["question"]


def test_a_reply_records_the_question_it_answers(store: SessionStore) -> None:
    store.create_session("s", "u", "b")
    store.append_message("s", "user", "question", 1)
    reply = store.append_message("s", "assistant", "answer", 1, reply_to=1)
    assert reply.reply_to == 1 and store.messages("s")[-1].reply_to == 1


def test_hold_waits_for_the_holder_then_gives_up_clearly(store_url) -> None:  # type: ignore[no-untyped-def]
    with SessionStore(store_url) as store:
        store.create_session("s", "u", "b")
        leases = TurnLeases(store._db, _now, ttl=timedelta(seconds=3))  # noqa: SLF001 - a short ttl
        order: list[str] = []
        with leases.hold("s") as held:
            waiter = threading.Thread(target=lambda: _hold_and_note(leases, order))
            waiter.start()
            time.sleep(0.3)
            order.append("first done")
            assert leases.renew("s", held.holder)
        waiter.join(timeout=10)
        assert order == ["first done", "second held"]
        with leases.hold("s"):
            with pytest.raises(SessionBusyError, match="another process"):
                with leases.hold("s", wait_s=0.2):
                    pass


def test_a_held_lease_is_renewed_while_the_turn_runs(store_url) -> None:  # type: ignore[no-untyped-def]
    with SessionStore(store_url) as store:
        store.create_session("s", "u", "b")
        leases = TurnLeases(store._db, _now, ttl=timedelta(seconds=0.6))  # noqa: SLF001 - a short ttl
        with leases.hold("s") as held:
            time.sleep(1.5)  # past two ttls: only the renewals keep it
            assert leases.try_acquire("s", "intruder") is None
            store.append_message("s", "user", "still mine", 1, lease=held.holder)


def _hold_and_note(leases: TurnLeases, order: list[str]) -> None:
    with leases.hold("s"):
        order.append("second held")


def _now() -> datetime:
    return datetime.now(timezone.utc)

"""Sessions expire after a quiet TTL, activity extends them, and pinned ones (a flow mid-way) are never cut off."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from chatcache.storage import DEFAULT_TTL, SessionClosedError, SessionStatus, SessionStore
from tests.session_tier.fake_clock import START, FakeClock


@pytest.fixture
def hourly(store_url: str | URL, clock: FakeClock) -> Iterator[SessionStore]:
    """A store whose sessions live an hour, on every backend `store` runs on."""
    with SessionStore(store_url, ttl=timedelta(hours=1), clock=clock) as opened:
        yield opened


def test_the_default_ttl_is_a_day(store: SessionStore) -> None:
    assert timedelta(hours=24) == DEFAULT_TTL
    assert store.create_session("s1", "ada", "travel").expires_at == START + timedelta(hours=24)


def test_quiet_sessions_expire_and_busy_ones_do_not(hourly: SessionStore, clock: FakeClock) -> None:
    hourly.create_session("quiet", "ada", "travel")
    hourly.create_session("busy", "ada", "travel")
    clock.advance(minutes=50)
    hourly.append_message("busy", "user", "still here", 2)  # pushes expiry to 1h50
    clock.advance(minutes=20)

    assert hourly.expire_sessions() == ["quiet"]
    assert hourly.get_session("quiet").status is SessionStatus.EXPIRED
    assert hourly.get_session("busy").status is SessionStatus.ACTIVE
    assert hourly.expire_sessions(START + timedelta(hours=2)) == ["busy"]


def test_expiry_is_due_exactly_at_expires_at(hourly: SessionStore) -> None:
    hourly.create_session("s1", "ada", "travel")

    assert hourly.expire_sessions(START + timedelta(minutes=59, seconds=59)) == []
    assert hourly.expire_sessions(START + timedelta(hours=1)) == ["s1"]


def test_expiring_twice_reports_each_session_once(hourly: SessionStore) -> None:
    hourly.create_session("s1", "ada", "travel")
    later = START + timedelta(hours=5)

    assert hourly.expire_sessions(later) == ["s1"]
    assert hourly.expire_sessions(later) == []


def test_ended_sessions_stay_ended(hourly: SessionStore) -> None:
    hourly.create_session("s1", "ada", "travel")
    hourly.end_session("s1")

    assert hourly.expire_sessions(START + timedelta(days=3)) == []
    assert hourly.get_session("s1").status is SessionStatus.ENDED


def test_a_pinned_session_never_expires_until_a_state_unpins_it(
    hourly: SessionStore, clock: FakeClock
) -> None:
    """The state's owner pins a session mid-flow; the store keeps it, reading nothing of the state."""
    session = hourly.create_session("s1", "ada", "travel")
    assert session.pinned is False
    in_flow = hourly.update_state("s1", {"flow": "booking"}, session.version, pinned=True)
    assert in_flow.pinned is True and in_flow.state == {"flow": "booking"}

    assert hourly.expire_sessions(START + timedelta(days=30)) == []
    assert hourly.get_session("s1").status is SessionStatus.ACTIVE

    clock.advance(days=30)
    hourly.update_state("s1", {"flow_active": True}, in_flow.version)  # opaque: no key of it pins
    assert hourly.expire_sessions(clock.now + timedelta(minutes=59)) == []
    assert hourly.expire_sessions(clock.now + timedelta(hours=1)) == ["s1"]


def test_an_expired_session_accepts_no_writes(hourly: SessionStore) -> None:
    session = hourly.create_session("s1", "ada", "travel")
    hourly.expire_sessions(START + timedelta(hours=2))

    with pytest.raises(SessionClosedError, match="expired"):
        hourly.append_message("s1", "user", "hello?", 2)
    with pytest.raises(SessionClosedError, match="expired"):
        hourly.update_state("s1", {}, session.version)
    assert hourly.messages("s1") == []


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1)])
def test_a_ttl_must_be_positive(tmp_path: Path, ttl: timedelta) -> None:
    with pytest.raises(ValueError, match="ttl"):
        SessionStore.open(tmp_path, ttl=ttl)

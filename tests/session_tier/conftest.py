"""Fixtures for the session tier: a store with a fake clock, on every backend `store_url`
gives (tests/conftest.py: SQLite, and PostgreSQL when `.ci/run` starts one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import URL

from chatcache.storage import SessionStore
from tests.session_tier.fake_clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(store_url: str | URL, clock: FakeClock) -> Iterator[SessionStore]:
    with SessionStore(store_url, clock=clock) as opened:
        yield opened
